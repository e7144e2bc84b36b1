"""The query-aware part of injection: embed the query, read the scope's vectors, fuse the ranks.

Kept out of the middleware so the request path reads as load, rank, render. Relevance only orders
what is injected, so when it cannot be had (the embedding endpoint or model fails or is slower than
half of ``memory_context_timeout_seconds``, the provider is misconfigured, a vector read fails) the
turn loses its relevance order, logged, never its memory: the facts go in by confidence as they
would without a query. The query is embedded on a pool of its own with a hard deadline, so a hung
endpoint holds one of those threads, never the caller or the memory-context pool.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

import numpy as np

from memstore.config import MemoryConfig
from memstore.document import MemoryDocument
from memstore.embedding import Embedder
from memstore.errors import EmbeddingUnavailableError, MemstoreError
from memstore.inject.relevance import MAX_QUERY_CHARS, RelevanceWeights, fused_scores
from memstore.scope import Scope
from memstore.storage.base import MemoryStorage
from memstore.storage.vectors import semantic_parts

logger = logging.getLogger(__name__)

# As many threads as the memory-context pool that calls it, so concurrent turns never queue here
# behind a healthy endpoint (a hung one holds its threads until its own client timeout).
_QUERY_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memstore-query-embed")


def relevance_scores(
    memory: MemoryDocument,
    query: str,
    config: MemoryConfig,
    storage: MemoryStorage,
    scope: Scope,
    others: Sequence[dict[str, Any]] = (),
) -> list[float] | None:
    """One fused score per entry of ``memory["facts"]`` then of ``others`` (other owners' facts the
    identity may read), or ``None`` for today's confidence order.

    Only the scope's own facts have their vectors read (fact ids are unique per scope, not across
    owners, so the others enter without an id): the others rank by text, confidence and recency.
    """
    raw = memory.get("facts")
    own = [fact if isinstance(fact, dict) else {} for fact in raw] if isinstance(raw, list) else []
    if not own and not others:
        return None
    facts = [*own, *({k: v for k, v in fact.items() if k != "id"} for fact in others)]
    named = [
        (fact["id"], fact["content"])
        for fact in own
        if isinstance(fact.get("id"), str) and isinstance(fact.get("content"), str)
    ]
    try:
        semantic = semantic_parts(config, storage)
        if semantic is None:
            return None
        embedder, store = semantic
        query_vector = _embed_query(
            embedder, query[:MAX_QUERY_CHARS], config.memory_context_timeout_seconds / 2
        )
        vectors = store.fact_vectors(scope, embedder.model, named)
    except MemstoreError as exc:
        logger.warning("facts injected by confidence, not relevance: %s", exc)
        return None
    except Exception:
        logger.exception("facts injected by confidence, not relevance: ranking failed")
        return None
    return fused_scores(facts, query, query_vector, vectors, RelevanceWeights.of(config))


def _embed_query(embedder: Embedder, query: str, deadline: float) -> np.ndarray:
    future = _QUERY_EXECUTOR.submit(embedder.embed_query, query)
    try:
        return future.result(timeout=deadline)
    except FutureTimeoutError:
        future.cancel()
        raise EmbeddingUnavailableError(f"the query's embedding took longer than {deadline:.2f} s") from None
