"""Explicit memory edits (create, update, delete, import, clear) and fact search.

Every helper takes the full scope (``agent_name`` plus keyword ``user_id``) and forwards it,
so a manual edit can never land in another user's or the global document.

Edits always start from a copy of the *loaded* document: providers may carry extra top-level
keys (the SQL provider's ``revision``) that let ``save`` merge concurrent writers, and a
document rebuilt from scratch would lose them. ``clear`` is the exception, because it means
"replace everything".

A merge may drop an edit that raced another writer (a duplicate added first elsewhere, a fact
deleted or changed first elsewhere), so each edit reads the scope back after its save, reports
what the store holds (``DuplicateFactError``, ``FactNotFoundError``, ``FactEditConflictError``)
and returns that stored document, never the one it sent. On the SQL provider the read after its
own save is answered from the cache after one revision check.
"""

from __future__ import annotations

from typing import Any

from memstore.config import get_memory_config
from memstore.document import (
    DEFAULT_CATEGORY,
    MANUAL_CONFIDENCE,
    MAX_CATEGORY_CHARS,
    MAX_FACT_CHARS,
    MemoryDocument,
    coerce_confidence,
    fact_content_key,
    new_fact_id,
    utc_now_iso_z,
)
from memstore.errors import (
    DuplicateFactError,
    FactEditConflictError,
    FactNotFoundError,
    QueryError,
    SimilarFactError,
    StorageWriteError,
)
from memstore.inject.relevance import (
    MAX_QUERY_CHARS,
    RelevanceWeights,
    fused_scores,
    ranked_order,
    similarities,
)
from memstore.ops.validation import (
    check_document,
    fact_category,
    fact_confidence,
    fact_content,
    search_text,
)
from memstore.scope import Scope, resolve_scope
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.operations import StorageOperations
from memstore.storage.records import MAX_PAGE_SIZE, SEARCH_MODES, FactFilter, SearchMode
from memstore.storage.vectors import semantic_parts
from memstore.update.apply import evict_to_cap
from memstore.update.similarity import most_similar, scope_vectors

Fact = dict[str, Any]

MANUAL_SOURCE = "manual"


def get_memory_data(agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
    return get_memory_storage().load(agent_name, user_id=user_id)


def reload_memory_data(agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
    """The scope's document read from the backing store, bypassing any cache."""
    return get_memory_storage().reload(agent_name, user_id=user_id)


def import_memory_data(
    memory: MemoryDocument, agent_name: str | None = None, *, user_id: str | None = None
) -> MemoryDocument:
    """Store ``memory`` as given for the scope and return what the store now holds.

    Raises ``InvalidDocumentError`` for a document over the size caps or holding text no
    provider can store (``memstore.ops.validation.check_document``).
    """
    if not isinstance(memory, dict):
        raise TypeError(f"memory must be a document dict, got {type(memory).__name__}")
    check_document(memory)
    storage = get_memory_storage()
    if not storage.save(memory, agent_name, user_id=user_id, origin="import"):
        raise StorageWriteError("Failed to save imported memory data")
    return storage.reload(agent_name, user_id=user_id)


def clear_memory_data(agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
    """Empty the scope's memory. Updates queued before the clear will not refill it (SQL provider)."""
    storage = get_memory_storage()
    if not storage.clear(agent_name, user_id=user_id):
        raise StorageWriteError("Failed to save cleared memory data")
    cleared = storage.load(agent_name, user_id=user_id)
    # What is stored (its lastUpdated included), but a fresh start: without a revision, saving
    # this document replaces the scope instead of merging into it.
    cleared.pop("revision", None)
    return cleared


def create_memory_fact_with_created_fact(
    content: str,
    category: str = DEFAULT_CATEGORY,
    confidence: float = MANUAL_CONFIDENCE,
    agent_name: str | None = None,
    *,
    user_id: str | None = None,
) -> tuple[MemoryDocument, Fact]:
    """Add a manual fact; returns the stored document and the fact that was built.

    The fact may be missing from the returned document when ``max_facts`` kept only
    higher-confidence facts; the caller can tell by looking for its id. A concurrent writer that
    stored the same content first makes this a ``DuplicateFactError`` too.
    """
    text = fact_content(content)
    category = fact_category(category)
    confidence = fact_confidence(confidence)
    memory = get_memory_data(agent_name, user_id=user_id)
    facts = _facts_of(memory)
    _refuse_duplicate(facts, text, ignore_id=None)
    config, storage = get_memory_config(), get_memory_storage()
    scope = resolve_scope(agent_name, user_id)
    semantic = semantic_parts(config, storage)
    if semantic is not None:
        embedder, store = semantic
        similar, vector = most_similar(
            text, category, facts, embedder=embedder, store=store, scope=scope, config=config
        )
        if similar is not None:
            raise SimilarFactError(similar.fact_id, similar.similarity, config.dedup_similarity)
    taken_ids = {fact.get("id") for fact in facts}
    fact_id = new_fact_id(taken_ids)
    created: Fact = {
        "id": fact_id,
        "content": text,
        "category": category,
        "confidence": confidence,
        "createdAt": utc_now_iso_z(),
        "source": MANUAL_SOURCE,
    }
    updated = dict(memory)
    over_cap = len(facts) >= config.max_facts
    signals = storage.fact_signals(agent_name, user_id=user_id) if over_cap else {}
    updated["facts"], removals = evict_to_cap([*facts, created], config, signals)
    stored = _save(updated, agent_name, user_id, "Failed to save memory after creating a fact", removals)
    if _fact_by_id(stored, fact_id) is None:
        _refuse_duplicate(_facts_of(stored), text, ignore_id=fact_id)
    elif semantic is not None:
        semantic[1].store_vectors(scope, semantic[0].model, [(fact_id, text, vector)])
    return stored, created


def create_memory_fact(
    content: str,
    category: str = DEFAULT_CATEGORY,
    confidence: float = MANUAL_CONFIDENCE,
    agent_name: str | None = None,
    *,
    user_id: str | None = None,
) -> MemoryDocument:
    """Add a manual fact and return the saved document."""
    memory, _ = create_memory_fact_with_created_fact(
        content, category, confidence, agent_name, user_id=user_id
    )
    return memory


def update_memory_fact(
    fact_id: str,
    content: str | None = None,
    category: str | None = None,
    confidence: float | None = None,
    agent_name: str | None = None,
    *,
    user_id: str | None = None,
) -> MemoryDocument:
    """Change the given fields of one fact; every other field (createdAt, source, ...) is kept.

    Returns the stored document. A fact deleted by another writer meanwhile is a
    ``FactNotFoundError``; one changed by another writer first is a ``FactEditConflictError``
    (or a ``DuplicateFactError`` when that writer took the new content).
    """
    memory = get_memory_data(agent_name, user_id=user_id)
    facts = _facts_of(memory)
    index = next((i for i, fact in enumerate(facts) if fact.get("id") == fact_id), None)
    if index is None:
        raise FactNotFoundError(fact_id)
    given: Fact = {}
    if content is not None:
        given["content"] = fact_content(content)
        _refuse_duplicate(facts, given["content"], ignore_id=fact_id)
    if category is not None:
        given["category"] = fact_category(category)
    if confidence is not None:
        given["confidence"] = fact_confidence(confidence)
    updated = dict(memory)
    updated["facts"] = [*facts[:index], {**facts[index], **given}, *facts[index + 1 :]]
    stored = _save(updated, agent_name, user_id, "Failed to save memory after updating a fact")
    held = _fact_by_id(stored, fact_id)
    if held is None:
        raise FactNotFoundError(fact_id)
    if any(held.get(key) != value for key, value in given.items()):
        if "content" in given:
            _refuse_duplicate(_facts_of(stored), given["content"], ignore_id=fact_id)
        raise FactEditConflictError(fact_id)
    return stored


def delete_memory_fact(
    fact_id: str, agent_name: str | None = None, *, user_id: str | None = None
) -> MemoryDocument:
    memory = get_memory_data(agent_name, user_id=user_id)
    facts = _facts_of(memory)
    kept = [fact for fact in facts if fact.get("id") != fact_id]
    if len(kept) == len(facts):
        raise FactNotFoundError(fact_id)
    updated = dict(memory)
    updated["facts"] = kept
    return _save(updated, agent_name, user_id, "Failed to save memory after deleting a fact")


def search_memory_facts(
    query: str,
    category: str | None = None,
    limit: int = 10,
    *,
    agent_name: str | None = None,
    user_id: str | None = None,
    mode: SearchMode = "fulltext",
) -> list[Fact]:
    """The scope's facts that match ``query``, best first; returns copies of the stored facts.

    ``fulltext``: on the SQL provider the full-text index ranks the words of ``query``
    (relevance, then confidence). Facts that only contain ``query`` as a substring (part of a
    word, or text the index cannot segment) follow, highest confidence first, as on the file
    provider. Case folding uses ``casefold``, so "STRASSE" finds "Straße". ``semantic`` ranks
    the scope's facts by cosine similarity to the query, ``hybrid`` by the fusion injection uses
    (``inject.relevance``); both need ``embedding_provider``. ``category`` is an exact filter.
    A query longer than the longest fact, or text no store can hold (NUL, a lone surrogate), is
    a ``QueryError``. The facts returned count as accessed (``MemoryStorage.record_access``).
    """
    needle = search_text("query", query.strip(), MAX_FACT_CHARS) if isinstance(query, str) else ""
    if category is not None:
        search_text("category", category, MAX_CATEGORY_CHARS)
    if not needle or limit <= 0:
        return []
    storage = get_memory_storage()
    facts = [
        fact
        for fact in _facts_of(storage.load(agent_name, user_id=user_id))
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
    else:
        scored = rank_by_meaning(storage, facts, needle, mode, resolve_scope(agent_name, user_id))
        matches = [fact for fact, _ in scored]
    found = [dict(fact) for fact in matches[:limit]]
    if found:
        ids = [fact_id for fact in found if isinstance(fact_id := fact.get("id"), str)]
        storage.record_access(agent_name, user_id=user_id, fact_ids=ids)
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
    page = storage.query_facts(where, search=query, limit=min(limit, MAX_PAGE_SIZE), offset=0)
    return [fact.fact_id for fact in page.facts] if page.search_mode == "fulltext" else []


def rank_by_meaning(
    storage: MemoryStorage, facts: list[Fact], query: str, mode: SearchMode, scope: Scope
) -> list[tuple[Fact, float]]:
    """One scope's ``facts`` with their scores, best first: cosine similarity to ``query``
    (``semantic``) or the fused rank injection uses (``hybrid``, ``inject.relevance``).

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
    else:
        scores = list(fused_scores(facts, query, vector, vectors, RelevanceWeights.of(config)))
    return [(facts[i], scores[i] or 0.0) for i in ranked_order(scores)]


def _facts_of(memory: MemoryDocument) -> list[Fact]:
    facts = memory.get("facts")
    if not isinstance(facts, list):
        return []
    return [fact for fact in facts if isinstance(fact, dict)]


def _refuse_duplicate(facts: list[Fact], content: str, *, ignore_id: object) -> None:
    key = fact_content_key(content)
    for fact in facts:
        existing = fact.get("content")
        if fact.get("id") != ignore_id and isinstance(existing, str) and fact_content_key(existing) == key:
            raise DuplicateFactError(fact.get("id"))


def _fact_by_id(memory: MemoryDocument, fact_id: str) -> Fact | None:
    return next((fact for fact in _facts_of(memory) if fact.get("id") == fact_id), None)


def _save(
    memory: MemoryDocument,
    agent_name: str | None,
    user_id: str | None,
    message: str,
    removals: dict[str, dict[str, Any]] | None = None,
) -> MemoryDocument:
    """Save ``memory`` and return what the store holds afterwards, which a merge may have changed.

    ``removals`` (evictions at the cap) reach the SQL provider's audit trail as ``detail``.
    """
    storage = get_memory_storage()
    if not storage.save(memory, agent_name, user_id=user_id, origin=MANUAL_SOURCE, removals=removals):
        raise StorageWriteError(message)
    return storage.load(agent_name, user_id=user_id)
