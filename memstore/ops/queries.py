"""Questions across users and scopes, and the operator's maintenance calls, from Python.

On the SQL provider each call is a few indexed statements (no document is loaded); on the
file provider it scans the tree. ``storage`` defaults to the configured provider. ``tenant_id``
(default: the default tenant) and ``roles`` bind the reads to an identity
(``MemoryStorage.for_identity``): another tenant's rows are never read. ``stats`` and ``vacuum``
are the operator's and cross tenants.

    from memstore.ops.queries import FactFilter, list_facts, search_facts
    page = list_facts(FactFilter(category="preference", min_confidence=0.8), limit=50)
    hits = search_facts("deer-flow", FactFilter(user_id="alice"))
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from memstore.config import MemoryConfig, get_memory_config
from memstore.document import MAX_FACT_CHARS
from memstore.embedding import Embedder
from memstore.errors import MemstoreError, QueryError
from memstore.inject.relevance import (
    MAX_QUERY_CHARS,
    RelevanceWeights,
    bm25_scores,
    relevance_scores,
    standing_scores,
)
from memstore.inject.rerank import rerank_order
from memstore.ops.validation import search_text
from memstore.retention import RetentionPolicy
from memstore.scope import Scope, validate_user_id
from memstore.storage.base import MemoryStorage
from memstore.storage.file import FileMemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.operations import StorageOperations
from memstore.storage.records import (
    FACT_ORDERS,
    MAX_PAGE_SIZE,
    SEARCH_MODES,
    FactFilter,
    FactOrder,
    FactPage,
    FactRecord,
    FactRelations,
    HistoryEntry,
    MemoryStats,
    SearchMode,
    check_paging,
    with_scores,
)
from memstore.storage.search_text import SEARCH_MATCHES, SearchMatch
from memstore.storage.sessions.loader import get_session_store, session_backend
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.maintenance import erase as maintenance
from memstore.storage.vectors import VectorStore, semantic_parts

if TYPE_CHECKING:
    import numpy as np


def operations_of(
    storage: MemoryStorage | None = None,
    *,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> StorageOperations:
    """The provider's query surface for the identity; a custom provider without one gets a clear error."""
    storage = _bound(storage, tenant_id, roles)
    if not isinstance(storage, StorageOperations):
        raise MemstoreError(
            f"{type(storage).__name__} does not support queries or maintenance; "
            "use SqlMemoryStorage or FileMemoryStorage"
        )
    return storage


def _bound(
    storage: MemoryStorage | None, tenant_id: str | None, roles: Iterable[str] | None
) -> MemoryStorage:
    """``storage`` (default: the configured one) as seen by the tenant and roles; with neither, as
    given (a handle already bound by ``for_identity`` keeps its identity)."""
    storage = storage if storage is not None else get_memory_storage()
    return storage if tenant_id is None and roles is None else storage.for_identity(tenant_id, roles)


def list_facts(
    where: FactFilter | None = None,
    *,
    limit: int = 50,
    offset: int = 0,
    order: FactOrder = "newest",
    storage: MemoryStorage | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> FactPage:
    """Live facts, one page plus the total, each with its retention ``score``.

    ``order``: ``newest`` (ties broken by insertion order), ``score`` (highest first; reads every
    matching fact, so narrow the filter at scale), ``last_accessed`` or ``access_count``.
    """
    check_paging(limit, offset)
    if order not in FACT_ORDERS:
        raise QueryError(f"unknown order {order!r}; use one of {', '.join(FACT_ORDERS)}")
    return operations_of(storage, tenant_id=tenant_id, roles=roles).query_facts(
        where or FactFilter(), search=None, limit=limit, offset=offset, order=order
    )


def search_facts(
    query: str,
    where: FactFilter | None = None,
    *,
    mode: SearchMode = "fulltext",
    match: SearchMatch | None = None,
    limit: int = 20,
    offset: int = 0,
    storage: MemoryStorage | None = None,
    config: MemoryConfig | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> FactPage:
    """Facts matching ``query`` across scopes, most relevant first.

    ``mode``: ``fulltext`` (the index's BM25, then confidence; the page's ``search_mode`` says
    whether the index or substring matching served it), ``semantic`` (cosine similarity of the
    facts' vectors to the query's, as ``rank``; needs ``embedding_provider``), or ``hybrid`` (both
    signals combined as ``relevance_fusion`` says, confidence and recency breaking ties, see
    ``inject.relevance``; ``rank`` is the fused score, and ``total`` counts the candidates fused:
    the best ``hybrid_pool`` (or twice the page's end) of each retriever). ``match`` (default:
    ``fulltext_match``) says whether a full-text hit needs ``any`` of the query's words (function
    words aside) or ``all`` of them. The text is never parsed as query syntax; longer than
    ``MAX_FACT_CHARS`` or holding what no store can (NUL, a lone surrogate) it is a ``QueryError``.
    This is an operator's search, so it counts as no access of the facts it finds (a user's own
    search, ``ops.facts.search_memory_facts``, does).
    """
    if not isinstance(query, str) or not query.strip():
        raise QueryError("the search query is empty")
    search_text("query", query, MAX_FACT_CHARS)
    if mode not in SEARCH_MODES:
        raise QueryError(f"unknown search mode {mode!r}; use one of {', '.join(SEARCH_MODES)}")
    if match is not None and match not in SEARCH_MATCHES:
        raise QueryError(f"unknown match {match!r}; use one of {', '.join(SEARCH_MATCHES)}")
    check_paging(limit, offset)
    query, where = query.strip(), where or FactFilter()
    config = config or get_memory_config()
    match = match or config.fulltext_match
    storage = _bound(storage, tenant_id, roles)
    operations = operations_of(storage)
    if mode == "fulltext":
        return operations.query_facts(where, search=query, limit=limit, offset=offset, match=match)
    embedder, store = _semantic(config, storage)
    vector = embedder.embed_query(query[:MAX_QUERY_CHARS])
    if mode == "semantic":
        page = store.nearest_facts(where, vector, model=embedder.model, limit=limit, offset=offset)
    else:
        pool = min(MAX_PAGE_SIZE, max(config.hybrid_pool, 2 * (offset + limit)))
        nearest = store.nearest_facts(where, vector, model=embedder.model, limit=pool, offset=0)
        matched = operations.query_facts(where, search=query, limit=pool, offset=0, match=match)
        page = _fused_page(query, nearest, matched, config, limit, offset)
    return replace(page, facts=with_scores(page.facts, RetentionPolicy.of(config), datetime.now(UTC)))


def _semantic(config: MemoryConfig, storage: MemoryStorage) -> tuple[Embedder, VectorStore]:
    parts = semantic_parts(config, storage)
    if parts is None:
        raise QueryError(
            "semantic and hybrid search need embeddings: set embedding_provider (openai or local)"
        )
    return parts


def _fused_page(
    query: str, nearest: FactPage, matched: FactPage, config: MemoryConfig, limit: int, offset: int
) -> FactPage:
    """Fuse the semantic and full-text candidates (``inject.relevance.relevance_scores``), then
    rerank the top.

    A candidate's semantic signal is its cosine similarity when the vector search returned it, its
    full-text signal the index's rank when the index did (BM25; when substring matching served that
    side, BM25 over the pool's text); confidence, recency, importance and
    decay rank the whole pool. With ``rerank`` set, the top ``rerank_top_n`` of the pool are
    reordered (``inject.rerank``; a failure keeps the fused order), so a reranked fact's ``rank``
    may be lower than the one after it. The page's ``total`` is the pool's size.
    """
    import numpy as np

    weights = RelevanceWeights.of(config)
    records: dict[tuple[str | None, str | None, str], FactRecord] = {}
    for record in [*nearest.facts, *matched.facts]:
        records.setdefault((record.user_id, record.agent_name, record.fact_id), record)
    keys = list(records)

    def signal(page: FactPage) -> np.ndarray:
        ranks = {(r.user_id, r.agent_name, r.fact_id): r.rank for r in page.facts}
        return np.array([math.nan if (rank := ranks.get(key)) is None else rank for key in keys])

    created = [math.nan if (stamp := records[key].created_at) is None else stamp.timestamp() for key in keys]
    confidence = np.array([records[key].confidence for key in keys], dtype=np.float64)
    lexical = signal(matched)
    if any(record.rank is None for record in matched.facts):
        # Substring matching served the full-text side (``all`` with CJK text) and ranked nothing:
        # BM25 over the pool's text stands in for the index's score.
        pooled = bm25_scores(query, [records[key].content for key in keys])
        lexical = np.array([score if score > 0 else math.nan for score in pooled])
    scores = relevance_scores(signal(nearest), lexical, confidence, np.array(created), weights)
    fused = dict(zip(keys, scores.tolist(), strict=True))
    standing = standing_scores([records[key].candidate() for key in keys], weights, datetime.now(UTC))
    fused = {key: fused[key] + standing[i] for i, key in enumerate(keys)}
    ranked = sorted(keys, key=lambda key: -fused[key])
    ranked = [ranked[i] for i in rerank_order(query, [records[key].content for key in ranked], config)]
    shown = ranked[offset : offset + limit]
    page = [replace(records[key], rank=round(fused[key], 6)) for key in shown]
    mode = f"hybrid:{nearest.search_mode.partition(':')[2]}+{matched.search_mode}"
    return FactPage(page, len(keys), limit, offset, mode)


def count_facts(
    where: FactFilter | None = None,
    *,
    storage: MemoryStorage | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> int:
    return list_facts(where, limit=1, storage=storage, tenant_id=tenant_id, roles=roles).total


def memory_stats(*, storage: MemoryStorage | None = None) -> MemoryStats:
    return operations_of(storage).stats()


def list_scopes(
    user_id: str | None = None,
    *,
    storage: MemoryStorage | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> list[Scope]:
    return operations_of(storage, tenant_id=tenant_id, roles=roles).list_scopes(validate_user_id(user_id))


def memory_history(
    where: FactFilter,
    *,
    fact_id: str | None = None,
    limit: int = 100,
    storage: MemoryStorage | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> list[HistoryEntry]:
    """The audit trail of the scopes ``where`` selects (its fact filters are ignored), oldest first."""
    check_paging(limit, 0)
    return operations_of(storage, tenant_id=tenant_id, roles=roles).history(
        where, fact_id=fact_id, limit=limit
    )


def fact_relations(
    fact_id: str,
    agent_name: str | None = None,
    *,
    user_id: str | None = None,
    storage: MemoryStorage | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> FactRelations:
    """The relations from and to one fact of the scope (its own scope's only): ``outgoing`` says
    what this fact is to others (it ``supersedes`` them, ...), ``incoming`` what others are to it."""
    if not isinstance(fact_id, str) or not fact_id:
        raise QueryError("a fact id is needed")
    operations = operations_of(storage, tenant_id=tenant_id, roles=roles)
    return operations.fact_relations(fact_id, agent_name, user_id=validate_user_id(user_id))


def erase_user(
    user_id: str,
    *,
    storage: MemoryStorage | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> dict[str, int]:
    """Delete everything stored for ``user_id`` in ``tenant_id``, audit history included; returns the
    counts removed."""
    if validate_user_id(user_id) is None:
        raise QueryError("erase needs a user id")
    bound = _bound(storage, tenant_id, roles)
    counts = operations_of(bound).erase_user(user_id)
    # The database's erase removed its sessions in its own transaction; another backend's go here.
    if session_backend(get_memory_config()) != "database":
        counts["sessions"] = get_session_store().erase_user(bound.identity.tenant_id, user_id)
    return counts


def vacuum(
    older_than: timedelta, *, storage: MemoryStorage | None = None, now: datetime | None = None
) -> dict[str, int]:
    """Purge audit history and tombstones older than ``older_than``; returns the counts purged.

    ``now`` (default: the call's time) is what ``older_than`` counts back from: given the one
    ``vacuum_counts`` used, the purge deletes no row that was not counted (rows only get newer).
    """
    return operations_of(storage).vacuum(_horizon(older_than, now))


def vacuum_counts(
    older_than: timedelta, *, storage: MemoryStorage | None = None, now: datetime | None = None
) -> dict[str, int] | None:
    """The rows ``vacuum`` would purge, per table, counted without deleting any.

    ``{}`` on the file provider, which keeps no history or tombstones; ``None`` on any other
    provider, which cannot tell in advance.
    """
    operations = operations_of(storage)
    if isinstance(operations, SqlMemoryStorage):
        return maintenance.vacuum_counts(operations.engine, _horizon(older_than, now))
    return {} if isinstance(operations, FileMemoryStorage) else None


def _horizon(older_than: timedelta, now: datetime | None) -> datetime:
    if older_than < timedelta(0):
        raise QueryError("older_than must not be negative")
    return (now or datetime.now(UTC)) - older_than
