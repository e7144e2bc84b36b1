"""Tool mode: memory operations an agent calls explicitly, as plain callables returning JSON.

Each tool returns a JSON object string and never raises, because an agent framework would
otherwise abort the run on a bad argument; failures come back as ``{"error": ...}`` for the
model to read. The scope defaults to the request's user (read at call time) and no agent; the
tenant and roles default to the request's too (``set_current_user``). The keyword arguments
(``user_id``, ``tenant_id``, ``roles``) are the server's to set, never the model's.
Wrap these with your framework's tool decorator; the docstrings are written for the model.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from memstore.config import MemoryConfig, get_memory_config
from memstore.document import DEFAULT_CATEGORY, MANUAL_CONFIDENCE
from memstore.errors import (
    EMBEDDINGS_FAILED_MESSAGE,
    STORAGE_UNAVAILABLE_MESSAGE,
    DuplicateFactError,
    EmbeddingError,
    MemstoreError,
    SessionLimitError,
    SessionStoreUnavailableError,
    StorageSetupError,
    StorageUnavailableError,
    StorageWriteError,
)
from memstore.gateway.middleware import MemoryMiddleware
from memstore.gateway.user_context import effective_roles, effective_tenant, get_effective_user_id
from memstore.inject.relevance import MAX_QUERY_CHARS
from memstore.ops.facts import (
    Visibility,
    create_memory_fact_with_created_fact,
    delete_memory_fact,
    search_memory_facts,
    update_memory_fact,
)
from memstore.ops.record_fields import MemoryType, SourceKind
from memstore.ops.validation import search_text
from memstore.storage.records import SearchMode

logger = logging.getLogger(__name__)

DUPLICATE_ERROR = "Duplicate fact"


def _result(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False)


def _error(exc: Exception, owner: str) -> str:
    """The one place tool failures become the error JSON the model reads.

    A store or embeddings failure gets the generic message the HTTP API gives, because its cause
    names the database; the cause is logged once at WARNING with the user, as a 503 is. A session
    write past a cap says which one (``limit``: ``turns`` or ``sessions``), as the HTTP 429 does.
    """
    if isinstance(exc, DuplicateFactError):
        return _result({"error": DUPLICATE_ERROR})
    if isinstance(exc, SessionLimitError):
        return _result({"error": str(exc), "limit": exc.kind})
    if isinstance(exc, SessionStoreUnavailableError):
        logger.warning("memory tool call of user %s failed, session store: %s", owner, exc)
        return _result({"error": STORAGE_UNAVAILABLE_MESSAGE})
    if isinstance(exc, (StorageUnavailableError, StorageWriteError, StorageSetupError)):
        logger.warning("memory tool call of user %s failed, storage: %s", owner, exc)
        return _result({"error": STORAGE_UNAVAILABLE_MESSAGE})
    if isinstance(exc, EmbeddingError):
        logger.warning("memory tool call of user %s failed, embeddings: %s", owner, exc)
        return _result({"error": EMBEDDINGS_FAILED_MESSAGE})
    if not isinstance(exc, MemstoreError):
        logger.exception("memory tool call of user %s failed", owner)
    return _result({"error": str(exc)})


def memory_search(
    query: str,
    category: str | None = None,
    limit: int = 10,
    *,
    user_id: str | None = None,
    agent_name: str | None = None,
    mode: SearchMode | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> str:
    """Search long-term memory for facts about the user, best match first.

    Args:
        query: What to look for: words the fact contains, or (with embeddings) what it means.
        category: Only facts of this category (preference, knowledge, context, behavior, goal,
            correction).
        limit: Maximum number of facts to return.
        mode: fulltext, semantic or hybrid; by default hybrid when embeddings are configured,
            fulltext otherwise.
    """
    owner = user_id or get_effective_user_id()
    try:
        if mode is None:
            mode = "fulltext" if get_memory_config().embedding_provider == "none" else "hybrid"
        results = search_memory_facts(
            query,
            category,
            limit,
            agent_name=agent_name,
            user_id=owner,
            mode=mode,
            tenant_id=effective_tenant(tenant_id),
            roles=effective_roles(roles),
        )
    except Exception as exc:
        return _error(exc, owner)
    return _result({"results": results, "count": len(results)})


def memory_add(
    content: str,
    category: str = DEFAULT_CATEGORY,
    confidence: float = MANUAL_CONFIDENCE,
    visibility: Visibility = "private",
    allowed_users: list[str] | None = None,
    allowed_roles: list[str] | None = None,
    memory_type: MemoryType | None = None,
    importance: float | None = None,
    tags: list[str] | None = None,
    source_kind: SourceKind | None = None,
    raw: str | None = None,
    structured: dict[str, Any] | None = None,
    *,
    user_id: str | None = None,
    agent_name: str | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> str:
    """Remember a stable fact about the user. Prefer memory_update over adding a near-duplicate.

    Args:
        content: The fact, as one short sentence (at most 2000 characters).
        category: One of preference, knowledge, context, behavior, goal, correction.
        confidence: How sure you are, from 0 to 1.
        visibility: private (only this user; the default), shared (the users and roles named in
            allowed_users and allowed_roles) or public (everyone in the organisation). Shared
            and public need the editor or admin role.
        allowed_users: With visibility shared: user ids that may read the fact.
        allowed_roles: With visibility shared: roles whose members may read the fact.
        memory_type: episodic (an event), semantic (knowledge), procedural (how the user works),
            preference or profile (who the user is); by default the category decides.
        importance: How much the fact matters, from 0 to 1 (default 0.5), apart from confidence.
        tags: Short labels (at most 16, each up to 64 characters, no commas).
        source_kind: explicit_user_input (the user said it), implicit_inference (you inferred
            it; the default), system_generated, external_data or corrected_memory.
        raw: The user's own words the fact comes from (at most 4000 characters).
        structured: The fact as a small JSON object, e.g. {"language": "Python"}.
    """
    owner = user_id or get_effective_user_id()
    try:
        memory, created = create_memory_fact_with_created_fact(
            content,
            category,
            confidence,
            agent_name,
            user_id=owner,
            tenant_id=effective_tenant(tenant_id),
            roles=effective_roles(roles),
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
    except Exception as exc:
        return _error(exc, owner)
    if not any(fact.get("id") == created["id"] for fact in memory.get("facts", [])):
        return _result(
            {"error": "Fact not stored: memory is full and every kept fact has a higher confidence"}
        )
    return _result({"fact_id": created["id"], "status": "added"})


def memory_update(
    fact_id: str,
    content: str | None = None,
    category: str | None = None,
    confidence: float | None = None,
    visibility: Visibility | None = None,
    allowed_users: list[str] | None = None,
    allowed_roles: list[str] | None = None,
    memory_type: MemoryType | None = None,
    importance: float | None = None,
    tags: list[str] | None = None,
    source_kind: SourceKind | None = None,
    raw: str | None = None,
    structured: dict[str, Any] | None = None,
    *,
    user_id: str | None = None,
    agent_name: str | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> str:
    """Correct a remembered fact; fields left empty keep their value.

    Args:
        fact_id: The id returned by memory_search or memory_add.
        content: New text of the fact (at most 2000 characters).
        category: New category.
        confidence: New confidence, from 0 to 1.
        visibility: New visibility: private, shared or public (shared and public need the
            editor or admin role).
        allowed_users: With visibility shared: the user ids that may read the fact.
        allowed_roles: With visibility shared: the roles whose members may read the fact.
        memory_type: New memory type: episodic, semantic, procedural, preference or profile.
        importance: New importance, from 0 to 1.
        tags: The fact's tags, replacing the current ones ([] removes them all).
        source_kind: New source kind (corrected_memory when you fix what was remembered).
        raw: The user's own words the fact comes from ("" removes them).
        structured: The fact as a small JSON object ({} removes it).
    """
    owner = user_id or get_effective_user_id()
    try:
        update_memory_fact(
            fact_id,
            content,
            category,
            confidence,
            agent_name,
            user_id=owner,
            tenant_id=effective_tenant(tenant_id),
            roles=effective_roles(roles),
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
    except Exception as exc:
        return _error(exc, owner)
    return _result({"fact_id": fact_id, "status": "updated"})


def memory_delete(
    fact_id: str,
    *,
    user_id: str | None = None,
    agent_name: str | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> str:
    """Forget a fact that is clearly wrong or no longer true.

    Args:
        fact_id: The id returned by memory_search or memory_add.
    """
    owner = user_id or get_effective_user_id()
    try:
        delete_memory_fact(
            fact_id,
            agent_name,
            user_id=owner,
            tenant_id=effective_tenant(tenant_id),
            roles=effective_roles(roles),
        )
    except Exception as exc:
        return _error(exc, owner)
    return _result({"fact_id": fact_id, "status": "deleted"})


def memory_context(
    query: str,
    *,
    user_id: str | None = None,
    agent_name: str | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> str:
    """The memory block to add to your prompt, with the facts most relevant to ``query`` first.

    Args:
        query: The user's latest message, or what you are about to work on (at most 2000
            characters). Empty ranks facts by confidence.
    """
    owner = user_id or get_effective_user_id()
    try:
        search_text("query", query, MAX_QUERY_CHARS)
        block = MemoryMiddleware(agent_name).read_memory_context(
            user_id=owner, query=query, tenant_id=tenant_id, roles=roles
        )
    except Exception as exc:
        return _error(exc, owner)
    return _result({"context": block})


def should_use_memory_tools(config: MemoryConfig | None = None) -> bool:
    """Whether the agent should get these tools: memory is on and ``mode`` is ``tool``.

    In tool mode the agent manages memory itself, so a gateway registers the tools instead of
    ``MemoryMiddleware``.
    """
    config = config or get_memory_config()
    if config.mode == "tool" and not config.enabled:
        logger.warning("memory.mode is 'tool' but memory.enabled is false; memory tools are not registered")
    return config.enabled and config.mode == "tool"


def get_memory_tools() -> list[Callable[..., str]]:
    """The four tools, in the order an agent usually needs them."""
    return [memory_search, memory_add, memory_update, memory_delete]
