"""The order of injection: embed the query, read the scope's vectors, fuse the ranks, rerank.

Kept out of the middleware so the request path reads as load, rank, render. Relevance only orders
what is injected, so when it cannot be had (the embedding endpoint or model fails or is slower than
half of ``memory_context_timeout_seconds``, the provider is misconfigured, a vector read fails) the
turn loses its relevance order, logged, never its memory: the facts go in as they would without a
query (by confidence, fused with importance and decay when those weights are set). The query is
embedded on a pool of its own with a hard deadline, so a hung endpoint holds one of those threads,
never the caller or the memory-context pool. The optional rerank (``inject.rerank``) reorders
the top of whichever order that is, within what is left of the read's deadline; it too can only
cost the order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from datetime import UTC, datetime
from typing import Any

import numpy as np

from memstore.async_face import bounded_here, running_loop
from memstore.config import MemoryConfig
from memstore.document import MemoryDocument
from memstore.embedding import Embedder
from memstore.errors import EmbeddingUnavailableError, MemstoreError
from memstore.inject.relevance import (
    MAX_QUERY_CHARS,
    RelevanceWeights,
    fact_confidence,
    fused_scores,
    ranked_order,
    standing_order,
)
from memstore.inject.rerank import rerank_order
from memstore.retention import FactSignals
from memstore.scope import Scope
from memstore.storage.base import MemoryStorage
from memstore.storage.vectors import semantic_parts

logger = logging.getLogger(__name__)

# As many threads as the memory-context pool that calls it, so concurrent turns never queue here
# behind a healthy endpoint (a hung one holds its threads until its own client timeout).
_QUERY_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memstore-query-embed")


def injection_scores(
    memory: MemoryDocument,
    query: str | None,
    config: MemoryConfig,
    storage: MemoryStorage,
    scope: Scope,
    others: Sequence[dict[str, Any]] = (),
    *,
    deadline: float | None = None,
) -> list[float] | None:
    """One score per entry of ``memory["facts"]`` then of ``others`` for ``render_memory``, or
    ``None`` for the plain confidence order (no query or no relevance, importance and decay
    weights 0, no rerank).

    ``deadline`` (a ``time.monotonic()`` instant) is when the read must be done: a rerank gets
    what is left of it, less a margin for rendering.
    """
    facts = _facts(memory, others)[1]
    if not facts:
        return None
    weights = RelevanceWeights.of(config)
    signals = _signals(storage, scope) if weights.decay > 0 else None
    query = query if query and query.strip() else None
    scores = None
    if query is not None:
        scores = relevance_scores(memory, query, config, storage, scope, others, signals=signals)
    if scores is None:
        scores = standing_order(facts, weights, signals, datetime.now(UTC))
    if query is not None and config.rerank != "none":
        left = None if deadline is None else deadline - time.monotonic() - _RENDER_MARGIN_SECONDS
        scores = _reranked(query, facts, scores, config, left)
    return scores


_RENDER_MARGIN_SECONDS = 0.1
"""What a rerank leaves of the read's deadline for rendering and counting the access."""


def _facts(
    memory: MemoryDocument, others: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The own facts (a malformed entry as ``{}``), and those then the others without their ids
    (fact ids are unique per scope, not across owners)."""
    raw = memory.get("facts")
    own = [fact if isinstance(fact, dict) else {} for fact in raw] if isinstance(raw, list) else []
    return own, [*own, *({k: v for k, v in fact.items() if k != "id"} for fact in others)]


def _signals(storage: MemoryStorage, scope: Scope) -> Mapping[str, FactSignals] | None:
    """The scope's retention signals for the decay ranking; ``None`` (decay from dates alone) when
    they cannot be read, which costs the order a signal, not the turn its memory."""
    user_id, agent_name = scope
    try:
        return storage.fact_signals(agent_name, user_id=user_id)
    except Exception as exc:
        logger.warning("facts ranked without their retention signals: %s", type(exc).__name__)
        return None


def _reranked(
    query: str,
    facts: Sequence[dict[str, Any]],
    scores: list[float] | None,
    config: MemoryConfig,
    seconds: float | None,
) -> list[float] | None:
    """``scores`` with the top ``rerank_top_n`` facts (that have text) lifted above the rest in
    the reranker's order; unchanged when the reranker fails or declines."""
    base = scores if scores is not None else [fact_confidence(fact) for fact in facts]
    ranked = [
        i for i in ranked_order(base) if isinstance(text := facts[i].get("content"), str) and text.strip()
    ][: config.rerank_top_n]
    order = rerank_order(query, [facts[i]["content"] for i in ranked], config, timeout=seconds)
    if order == list(range(len(ranked))):
        return scores
    lifted = list(base)
    ceiling = max(base, default=0.0)
    for position, choice in enumerate(order):
        lifted[ranked[choice]] = ceiling + len(order) - position
    return lifted


def relevance_scores(
    memory: MemoryDocument,
    query: str,
    config: MemoryConfig,
    storage: MemoryStorage,
    scope: Scope,
    others: Sequence[dict[str, Any]] = (),
    *,
    signals: Mapping[str, FactSignals] | None = None,
) -> list[float] | None:
    """One fused score per entry of ``memory["facts"]`` then of ``others`` (other owners' facts the
    identity may read), or ``None`` when relevance cannot be had.

    Only the scope's own facts have their vectors read (fact ids are unique per scope, not across
    owners, so the others enter without an id): the others rank by text, confidence and recency.
    """
    own, facts = _facts(memory, others)
    if not facts:
        return None
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
    return fused_scores(facts, query, query_vector, vectors, RelevanceWeights.of(config), signals=signals)


def _embed_query(embedder: Embedder, query: str, deadline: float) -> np.ndarray:
    if running_loop() is not None:
        try:
            return bounded_here(deadline, embedder.embed_query, query)
        except TimeoutError:
            raise EmbeddingUnavailableError(
                f"the query's embedding took longer than {deadline:.2f} s"
            ) from None
    future = _QUERY_EXECUTOR.submit(embedder.embed_query, query)
    try:
        return future.result(timeout=deadline)
    except FutureTimeoutError:
        future.cancel()
        raise EmbeddingUnavailableError(f"the query's embedding took longer than {deadline:.2f} s") from None
