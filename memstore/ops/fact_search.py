"""A user's own search of its facts (``search_memory_facts``) and ranking by meaning.

Kept apart from the edits in ``facts.py``, which re-exports both; ``facts_of`` is the one reading
of a document's fact list that both use.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from memstore.config import get_memory_config
from memstore.document import MAX_CATEGORY_CHARS, MAX_FACT_CHARS, MemoryDocument, coerce_confidence
from memstore.errors import QueryError
from memstore.inject.relevance import (
    MAX_QUERY_CHARS,
    RelevanceWeights,
    fused_scores,
    ranked_order,
    similarities,
)
from memstore.inject.rerank import rerank_order
from memstore.ops.validation import search_text
from memstore.scope import Scope, resolve_scope
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.operations import StorageOperations
from memstore.storage.records import MAX_PAGE_SIZE, SEARCH_MODES, FactFilter, SearchMode
from memstore.storage.vectors import semantic_parts
from memstore.update.similarity import scope_vectors

Fact = dict[str, Any]


def facts_of(memory: MemoryDocument) -> list[Fact]:
    facts = memory.get("facts")
    if not isinstance(facts, list):
        return []
    return [fact for fact in facts if isinstance(fact, dict)]


def storage_for(tenant_id: str | None, roles: Iterable[str] | None) -> MemoryStorage:
    """The configured store as seen by the identity's tenant and roles."""
    return get_memory_storage().for_identity(tenant_id, roles)


def search_memory_facts(
    query: str,
    category: str | None = None,
    limit: int = 10,
    *,
    agent_name: str | None = None,
    user_id: str | None = None,
    mode: SearchMode = "fulltext",
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> list[Fact]:
    """The scope's facts that match ``query``, best first; returns copies of the stored facts.

    ``fulltext``: on the SQL provider the full-text index ranks the facts holding any word of
    ``query`` (or all of them, as ``fulltext_match`` says) by BM25, then confidence. Facts that
    only contain ``query`` as a substring (part of a word, or text the index cannot segment)
    follow, highest confidence first, as on the file provider. Case folding uses ``casefold``, so
    "STRASSE" finds "Straße". ``semantic`` ranks the scope's facts by cosine similarity to the
    query, ``hybrid`` by the fusion injection uses (``inject.relevance``); both need
    ``embedding_provider``. ``category`` is an exact filter.
    A query longer than the longest fact, or text no store can hold (NUL, a lone surrogate), is
    a ``QueryError``. The facts returned count as accessed (``MemoryStorage.record_access``).
    The scope is looked up in ``tenant_id`` (default: the default tenant).
    """
    needle = search_text("query", query.strip(), MAX_FACT_CHARS) if isinstance(query, str) else ""
    if category is not None:
        search_text("category", category, MAX_CATEGORY_CHARS)
    if not needle or limit <= 0:
        return []
    storage = storage_for(tenant_id, roles)
    facts = [
        fact
        for fact in facts_of(storage.load(agent_name, user_id=user_id))
        if isinstance(fact.get("content"), str) and (category is None or fact.get("category") == category)
    ]
    if mode not in SEARCH_MODES:
        raise QueryError(f"unknown search mode {mode!r}; use one of {', '.join(SEARCH_MODES)}")
    if mode == "fulltext":
        ranked = _fulltext_ids(storage, needle, category, limit, agent_name=agent_name, user_id=user_id)
        by_id = {fact.get("id"): fact for fact in facts}
        matches = [by_id[fact_id] for fact_id in ranked if fact_id in by_id]
        folded = needle.casefold()
        substring = [fact for fact in facts if fact not in matches and folded in fact["content"].casefold()]
        substring.sort(key=lambda fact: coerce_confidence(fact.get("confidence")), reverse=True)
        matches += substring
        matches += _shared_matches(storage, folded, category, agent_name=agent_name, user_id=user_id)
    else:
        scored = rank_by_meaning(storage, facts, needle, mode, resolve_scope(agent_name, user_id))
        matches = [fact for fact, _ in scored]
    mine = {id(fact) for fact in facts}  # accesses count on the user's own facts only
    own = [
        fact_id for fact in matches[:limit] if id(fact) in mine and isinstance(fact_id := fact.get("id"), str)
    ]
    found = [dict(fact) for fact in matches[:limit]]
    if own:
        storage.record_access(agent_name, user_id=user_id, fact_ids=own)
    return found


def _shared_matches(
    storage: MemoryStorage, folded: str, category: str | None, *, agent_name: str | None, user_id: str | None
) -> list[Fact]:
    """Other owners' facts the identity may read (``visible_facts``) that contain the query, most
    confident first, after the user's own; each keeps its ``visibility``. Semantic and hybrid
    search rank the user's own facts only: the others' vectors live in their owners' scopes."""
    visible = getattr(storage, "visible_facts", None)
    if not callable(visible):
        return []
    found = [
        fact
        for fact in visible(agent_name, user_id=user_id)
        if isinstance(fact.get("content"), str)
        and folded in fact["content"].casefold()
        and (category is None or fact.get("category") == category)
    ]
    found.sort(key=lambda fact: coerce_confidence(fact.get("confidence")), reverse=True)
    return found


def _fulltext_ids(
    storage: MemoryStorage,
    query: str,
    category: str | None,
    limit: int,
    *,
    agent_name: str | None,
    user_id: str | None,
) -> list[str]:
    """Fact ids a full-text index ranks for the scope; none when the provider has no index.

    The legacy global scope (no user) is left to substring matching: a filter without a user
    means "every user", and its page could be filled by other users' facts.
    """
    user, agent = resolve_scope(agent_name, user_id)
    if user is None or not isinstance(storage, StorageOperations):
        return []
    where = FactFilter(user_id=user, agent_name=agent, category=category)
    page = storage.query_facts(
        where,
        search=query,
        limit=min(limit, MAX_PAGE_SIZE),
        offset=0,
        match=get_memory_config().fulltext_match,
    )
    return [fact.fact_id for fact in page.facts] if page.search_mode == "fulltext" else []


def rank_by_meaning(
    storage: MemoryStorage, facts: list[Fact], query: str, mode: SearchMode, scope: Scope
) -> list[tuple[Fact, float]]:
    """One scope's ``facts`` with their scores, best first: cosine similarity to ``query``
    (``semantic``) or the fused rank injection uses (``hybrid``, ``inject.relevance``, with the
    scope's retention signals for the decay ranking), its top reranked when ``rerank`` is set
    (``inject.rerank``; a failure keeps the fused order).

    Facts without a vector yet (saved by a host that does not embed, such as DeerMem, or before
    embeddings were configured) are embedded and stored first, in one call. Without embeddings
    configured this is a ``QueryError``: a search by meaning cannot be served.
    """
    config = get_memory_config()
    parts = semantic_parts(config, storage)
    if parts is None:
        raise QueryError(
            "semantic and hybrid search need embeddings: set embedding_provider (openai or local)"
        )
    embedder, store = parts
    vector = embedder.embed_query(query[:MAX_QUERY_CHARS])
    vectors, made = scope_vectors(facts, embedder, store, scope)
    store.store_vectors(scope, embedder.model, made)
    scores: list[float | None]
    if mode == "semantic":
        scores = similarities(facts, vector, vectors)
        return [(facts[i], scores[i] or 0.0) for i in ranked_order(scores)]
    weights = RelevanceWeights.of(config)
    user_id, agent_name = scope
    signals = storage.fact_signals(agent_name, user_id=user_id) if weights.decay > 0 else None
    scores = list(fused_scores(facts, query, vector, vectors, weights, signals=signals))
    ranked = ranked_order(scores)
    order = rerank_order(query, [facts[i]["content"] for i in ranked], config)
    return [(facts[ranked[i]], scores[ranked[i]] or 0.0) for i in order]
