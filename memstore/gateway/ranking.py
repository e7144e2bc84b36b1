"""The query-aware part of injection: embed the query, read the scope's vectors, fuse the ranks.

Kept out of the middleware so the request path reads as load, rank, render. A query embedding
that fails (the endpoint is down, or slower than half of ``memory_context_timeout_seconds``) or a
vector read that fails costs this turn its relevance order, logged, never its memory: the facts
go in by confidence as they would without a query.
"""

from __future__ import annotations

import logging

from memstore.config import MemoryConfig
from memstore.document import MemoryDocument
from memstore.errors import EmbeddingError, StorageUnavailableError
from memstore.inject.relevance import MAX_QUERY_CHARS, RelevanceWeights, fused_scores
from memstore.scope import Scope
from memstore.storage.base import MemoryStorage
from memstore.storage.vectors import semantic_parts

logger = logging.getLogger(__name__)


def relevance_scores(
    memory: MemoryDocument, query: str, config: MemoryConfig, storage: MemoryStorage, scope: Scope
) -> list[float] | None:
    """One fused score per entry of ``memory["facts"]``, or ``None`` for today's confidence order."""
    semantic = semantic_parts(config, storage)
    raw = memory.get("facts")
    if semantic is None or not isinstance(raw, list):
        return None
    facts = [fact if isinstance(fact, dict) else {} for fact in raw]
    embedder, store = semantic
    named = [
        (fact["id"], fact["content"])
        for fact in facts
        if isinstance(fact.get("id"), str) and isinstance(fact.get("content"), str)
    ]
    try:
        query_vector = embedder.embed_query(query[:MAX_QUERY_CHARS])
        vectors = store.fact_vectors(scope, embedder.model, named)
    except (EmbeddingError, StorageUnavailableError) as exc:
        logger.warning("facts injected by confidence, not relevance: %s", exc)
        return None
    return fused_scores(facts, query, query_vector, vectors, RelevanceWeights.of(config))
