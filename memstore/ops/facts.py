"""Explicit memory edits (create, update, delete, import, clear) and fact search.

Every helper takes the full scope (``agent_name`` plus keyword ``user_id``) and forwards it,
so a manual edit can never land in another user's or the global document. ``tenant_id`` (default:
the default tenant) and ``roles`` say whose store and which rights: the scope is looked up inside
the tenant, and a shared or public fact (``visibility``) needs the role ``editor`` or ``admin``
(``validation.check_may_share``); grants (``allowed_users``, ``allowed_roles``) exist only on a
shared fact.

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

from collections.abc import Iterable, Mapping
from typing import Any

from memstore.config import get_memory_config
from memstore.document import (
    DEFAULT_CATEGORY,
    MANUAL_CONFIDENCE,
    MemoryDocument,
    fact_content_key,
    new_fact_id,
    utc_now_iso_z,
)
from memstore.errors import (
    AccessDeniedError,
    DuplicateFactError,
    FactEditConflictError,
    FactNotFoundError,
    SimilarFactError,
    StorageWriteError,
)
from memstore.ops.fact_access import Visibility, is_private, new_access, owner_of, without_private
from memstore.ops.fact_search import facts_of, rank_by_meaning, search_memory_facts, storage_for
from memstore.ops.record_fields import RecordFields
from memstore.ops.validation import (
    ACCESS_KEYS,
    access_of,
    check_document,
    check_document_access,
    check_may_share,
    fact_access,
    fact_category,
    fact_confidence,
    fact_content,
)
from memstore.scope import resolve_scope
from memstore.storage.base import MemoryStorage
from memstore.storage.vectors import semantic_parts
from memstore.update.apply import evict_to_cap
from memstore.update.similarity import most_similar

__all__ = [
    "Visibility",
    "clear_memory_data",
    "create_memory_fact",
    "create_memory_fact_with_created_fact",
    "delete_memory_fact",
    "get_memory_data",
    "import_memory_data",
    "rank_by_meaning",
    "reload_memory_data",
    "search_memory_facts",
    "update_memory_fact",
]

Fact = dict[str, Any]

MANUAL_SOURCE = "manual"


def get_memory_data(
    agent_name: str | None = None,
    *,
    user_id: str | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> MemoryDocument:
    return storage_for(tenant_id, roles).load(agent_name, user_id=user_id)


def reload_memory_data(
    agent_name: str | None = None,
    *,
    user_id: str | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> MemoryDocument:
    """The scope's document read from the backing store, bypassing any cache."""
    return storage_for(tenant_id, roles).reload(agent_name, user_id=user_id)


def import_memory_data(
    memory: MemoryDocument,
    agent_name: str | None = None,
    *,
    user_id: str | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> MemoryDocument:
    """Store ``memory`` as given for the scope and return what the store now holds.

    Raises ``InvalidDocumentError`` for a document over the size caps or holding text no
    provider can store (``memstore.ops.validation.check_document``), and ``AccessDeniedError``
    when it holds shared or public facts and ``roles`` has neither ``editor`` nor ``admin``.
    """
    if not isinstance(memory, dict):
        raise TypeError(f"memory must be a document dict, got {type(memory).__name__}")
    check_document(memory)
    check_document_access(memory, roles)
    storage = storage_for(tenant_id, roles)
    if not storage.save(memory, agent_name, user_id=user_id, origin="import"):
        raise StorageWriteError("Failed to save imported memory data")
    return storage.reload(agent_name, user_id=user_id)


def clear_memory_data(
    agent_name: str | None = None,
    *,
    user_id: str | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> MemoryDocument:
    """Empty the scope's memory. Updates queued before the clear will not refill it (SQL provider)."""
    storage = storage_for(tenant_id, roles)
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
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
    visibility: Visibility = "private",
    allowed_users: Iterable[str] | None = None,
    allowed_roles: Iterable[str] | None = None,
    memory_type: str | None = None,
    importance: float | None = None,
    tags: Iterable[str] | None = None,
    source_kind: str | None = None,
    raw: str | None = None,
    structured: Mapping[str, Any] | None = None,
) -> tuple[MemoryDocument, Fact]:
    """Add a manual fact; returns the stored document and the fact that was built.

    The fact may be missing from the returned document when ``max_facts`` kept only
    higher-confidence facts; the caller can tell by looking for its id. A concurrent writer that
    stored the same content first makes this a ``DuplicateFactError`` too. A ``shared`` or
    ``public`` fact needs ``roles`` to hold ``editor`` or ``admin`` (``AccessDeniedError``).
    The record fields (``memory_type`` ... ``structured``) are checked and stored as
    ``ops.record_fields`` says; left out, the fact has none (no ``sourceKind`` either).
    """
    text = fact_content(content)
    category = fact_category(category)
    confidence = fact_confidence(confidence)
    record = RecordFields.of(
        memory_type=memory_type,
        importance=importance,
        tags=tags,
        source_kind=source_kind,
        raw=raw,
        structured=structured,
    )
    access = fact_access(visibility, allowed_users, allowed_roles)
    check_may_share(access, roles)
    storage = storage_for(tenant_id, roles)
    memory = storage.load(agent_name, user_id=user_id)
    facts = facts_of(memory)
    _refuse_duplicate(facts, text, ignore_id=None)
    config = get_memory_config()
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
    created: Fact = record.applied_to(
        {
            "id": fact_id,
            "content": text,
            "category": category,
            "confidence": confidence,
            "createdAt": utc_now_iso_z(),
            "source": MANUAL_SOURCE,
            **access,
        }
    )
    updated = dict(memory)
    over_cap = len(facts) >= config.max_facts
    signals = storage.fact_signals(agent_name, user_id=user_id) if over_cap else {}
    updated["facts"], removals = evict_to_cap([*facts, created], config, signals)
    message = "Failed to save memory after creating a fact"
    stored = _save(storage, updated, agent_name, user_id, message, removals)
    if _fact_by_id(stored, fact_id) is None:
        _refuse_duplicate(facts_of(stored), text, ignore_id=fact_id)
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
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
    visibility: Visibility = "private",
    allowed_users: Iterable[str] | None = None,
    allowed_roles: Iterable[str] | None = None,
    memory_type: str | None = None,
    importance: float | None = None,
    tags: Iterable[str] | None = None,
    source_kind: str | None = None,
    raw: str | None = None,
    structured: Mapping[str, Any] | None = None,
) -> MemoryDocument:
    """Add a manual fact and return the saved document."""
    memory, _ = create_memory_fact_with_created_fact(
        content,
        category,
        confidence,
        agent_name,
        user_id=user_id,
        tenant_id=tenant_id,
        roles=roles,
        visibility=visibility,
        allowed_users=allowed_users,
        allowed_roles=allowed_roles,
        memory_type=memory_type,
        importance=importance,
        tags=tags,
        source_kind=source_kind,
        raw=raw,
        structured=structured,
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
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
    visibility: Visibility | None = None,
    allowed_users: Iterable[str] | None = None,
    allowed_roles: Iterable[str] | None = None,
    owner_id: str | None = None,
    memory_type: str | None = None,
    importance: float | None = None,
    tags: Iterable[str] | None = None,
    source_kind: str | None = None,
    raw: str | None = None,
    structured: Mapping[str, Any] | None = None,
    origin: str = MANUAL_SOURCE,
) -> MemoryDocument:
    """Change the given fields of one fact; every other field (createdAt, source, ...) is kept.

    Returns the stored document. A fact deleted by another writer meanwhile is a
    ``FactNotFoundError``; one changed by another writer first is a ``FactEditConflictError``
    (or a ``DuplicateFactError`` when that writer took the new content). ``visibility`` and the
    grant lists change who else reads the fact (``new_access``); making it, or keeping it,
    shared or public that way needs ``editor`` or ``admin``. ``owner_id`` names another user whose
    shared or public fact the tenant's ``admin`` edits (``owner_of``); the admin may not make it
    private. The record fields (``memory_type`` ... ``structured``) change as ``ops.record_fields``
    says: set to its default, a field's key goes. ``origin`` labels the change in the audit trail
    (the operator console records its operator there).
    """
    record = RecordFields.of(
        memory_type=memory_type,
        importance=importance,
        tags=tags,
        source_kind=source_kind,
        raw=raw,
        structured=structured,
    )
    owner, as_admin = owner_of(user_id, owner_id, roles)
    storage = storage_for(tenant_id, roles)
    memory = storage.load(agent_name, user_id=owner)
    facts = facts_of(memory)
    index = next((i for i, fact in enumerate(facts) if fact.get("id") == fact_id), None)
    if index is None or (as_admin and is_private(facts[index])):
        raise FactNotFoundError(fact_id)
    if as_admin and visibility == "private":
        raise AccessDeniedError("only its owner may make a fact private")
    # An admin compares with what it may read, or a refused duplicate would tell it a private text.
    comparable = [fact for fact in facts if not (as_admin and is_private(fact))]
    given: Fact = {}
    if content is not None:
        given["content"] = fact_content(content)
        _refuse_duplicate(comparable, given["content"], ignore_id=fact_id)
    if category is not None:
        given["category"] = fact_category(category)
    if confidence is not None:
        given["confidence"] = fact_confidence(confidence)
    current = facts[index]
    access = new_access(current, visibility, allowed_users, allowed_roles, roles)
    changed = {key: value for key, value in current.items() if access is None or key not in ACCESS_KEYS}
    updated = dict(memory)
    edited = record.applied_to({**changed, **given, **(access or {})})
    updated["facts"] = [*facts[:index], edited, *facts[index + 1 :]]
    message = "Failed to save memory after updating a fact"
    stored = _save(storage, updated, agent_name, owner, message, origin=origin)
    held = _fact_by_id(stored, fact_id)
    if held is None:
        raise FactNotFoundError(fact_id)
    if (
        any(held.get(key) != value for key, value in given.items())
        or not record.held_by(held)
        or (access is not None and access_of(held) != access)
    ):
        if "content" in given:
            readable = [fact for fact in facts_of(stored) if not (as_admin and is_private(fact))]
            _refuse_duplicate(readable, given["content"], ignore_id=fact_id)
        raise FactEditConflictError(fact_id)
    return without_private(stored) if as_admin else stored


def delete_memory_fact(
    fact_id: str,
    agent_name: str | None = None,
    *,
    user_id: str | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
    owner_id: str | None = None,
    origin: str = MANUAL_SOURCE,
) -> MemoryDocument:
    """Remove one of the scope's facts; its owner may, whatever its visibility, and the tenant's
    ``admin`` may remove another user's (``owner_id``) shared or public fact. ``origin`` labels
    the removal in the audit trail."""
    owner, as_admin = owner_of(user_id, owner_id, roles)
    storage = storage_for(tenant_id, roles)
    memory = storage.load(agent_name, user_id=owner)
    facts = facts_of(memory)
    kept = [fact for fact in facts if fact.get("id") != fact_id or (as_admin and is_private(fact))]
    if len(kept) == len(facts):
        raise FactNotFoundError(fact_id)
    updated = dict(memory)
    updated["facts"] = kept
    message = "Failed to save memory after deleting a fact"
    stored = _save(storage, updated, agent_name, owner, message, origin=origin)
    return without_private(stored) if as_admin else stored


def _refuse_duplicate(facts: list[Fact], content: str, *, ignore_id: object) -> None:
    key = fact_content_key(content)
    for fact in facts:
        existing = fact.get("content")
        if fact.get("id") != ignore_id and isinstance(existing, str) and fact_content_key(existing) == key:
            raise DuplicateFactError(fact.get("id"))


def _fact_by_id(memory: MemoryDocument, fact_id: str) -> Fact | None:
    return next((fact for fact in facts_of(memory) if fact.get("id") == fact_id), None)


def _save(
    storage: MemoryStorage,
    memory: MemoryDocument,
    agent_name: str | None,
    user_id: str | None,
    message: str,
    removals: dict[str, dict[str, Any]] | None = None,
    *,
    origin: str = MANUAL_SOURCE,
) -> MemoryDocument:
    """Save ``memory`` and return what the store holds afterwards, which a merge may have changed.

    ``removals`` (evictions at the cap) reach the SQL provider's audit trail as ``detail``.
    """
    if not storage.save(memory, agent_name, user_id=user_id, origin=origin, removals=removals):
        raise StorageWriteError(message)
    return storage.load(agent_name, user_id=user_id)
