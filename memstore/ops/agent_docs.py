"""The agent's own documents for every entry point: list, read, write, edit, delete, history.

The agent's file tools (LangChain, MCP), the CLI and the HTTP routes all call these, so each
gets the same path checks, caps, version checks and errors. ``doc_scope`` decides whose
documents a call reaches: the agent's own in the tenant, or, with ``agent_doc_per_user``, the
user's own documents of that agent. Documents need the SQL provider: they are rows with versions.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from memstore.agent_doc import (
    AUTHORS,
    DOC_ROOT,
    MAIN_DOC_PATH,
    AgentDocument,
    DocAgentSummary,
    DocLimits,
    DocScope,
    DocVersion,
    checked_folder,
    replaced_once,
)
from memstore.async_face import held
from memstore.config import MemoryConfig, get_memory_config
from memstore.errors import AgentDocNotFoundError, ConfigError
from memstore.scope import DEFAULT_TENANT_ID
from memstore.storage.loader import load_storage_class
from memstore.storage.records import iso
from memstore.storage.sql.agent_docs.store import AgentDocStore
from memstore.storage.sql.documents.provider import SqlMemoryStorage
from memstore.storage.sql.engine import database_url_from_config

MAX_HISTORY_LIMIT = 100
_stores: dict[str, AgentDocStore] = {}
_lock = threading.Lock()


def get_agent_doc_store(config: MemoryConfig | None = None) -> AgentDocStore:
    """The store of the configured database (one per URL, shared by every thread)."""
    config = config or get_memory_config()
    if not issubclass(load_storage_class(config.storage_class), SqlMemoryStorage):
        raise ConfigError(
            f"agent documents live in the memory database and need the SQL provider, but storage_class "
            f"is {config.storage_class}"
        )
    url = database_url_from_config(config)
    with held(_lock):  # building the store may read the database: on the async face, yield meanwhile
        store = _stores.get(url)
        if store is None:
            store = _stores[url] = AgentDocStore(url)
        return store


def reset_agent_doc_stores() -> None:
    """Forget every store (tests, and a process that changes its configuration)."""
    with _lock:
        _stores.clear()


def doc_scope(
    agent_name: str | None,
    user_id: str | None,
    tenant_id: str = DEFAULT_TENANT_ID,
    *,
    config: MemoryConfig | None = None,
) -> DocScope:
    """The documents an agent serving ``user_id`` reaches: its own, or with ``agent_doc_per_user``
    the user's (a call with no user then reaches the agent's own)."""
    config = config or get_memory_config()
    return DocScope(agent_name, user_id if config.agent_doc_per_user else None, tenant_id)


def doc_limits(config: MemoryConfig | None = None) -> DocLimits:
    config = config or get_memory_config()
    return DocLimits(
        max_doc_chars=config.agent_doc_max_chars,
        max_docs=config.agent_doc_max_docs,
        max_total_chars=config.agent_doc_max_total_chars,
        history_keep=config.agent_doc_history_keep,
    )


def _author(author: str) -> str:
    if author not in AUTHORS:
        raise ValueError(f"author must be one of {', '.join(AUTHORS)}")
    return author


def list_docs(scope: DocScope, folder: object = DOC_ROOT, *, actor: str | None = None) -> list[AgentDocument]:
    """The live documents under ``folder`` (default every one), by path, without their text."""
    return get_agent_doc_store().list_documents(scope, checked_folder(folder), actor=actor)


def read_doc(scope: DocScope, path: object, *, actor: str | None = None) -> AgentDocument:
    return get_agent_doc_store().read(scope, path, actor=actor)


def load_main_doc(scope: DocScope, *, actor: str | None = None) -> AgentDocument | None:
    """``/memories/agent.md``, or ``None`` when the agent has none yet."""
    try:
        return read_doc(scope, MAIN_DOC_PATH, actor=actor)
    except AgentDocNotFoundError:
        return None


def write_doc(
    scope: DocScope,
    path: object,
    content: object,
    *,
    expected_version: int | None,
    author: str,
    actor: str | None = None,
) -> AgentDocument:
    """Write the whole document; ``expected_version`` ``0`` creates only, ``n`` overwrites version
    ``n`` only, ``None`` overwrites whatever is there (operators and imports)."""
    return get_agent_doc_store().change(
        scope,
        path,
        lambda _live: content,
        action="write",
        expected_version=expected_version,
        author=_author(author),
        actor=actor,
        limits=doc_limits(),
        now=datetime.now(UTC),
    )


def edit_doc(
    scope: DocScope,
    path: object,
    old_string: object,
    new_string: object,
    *,
    expected_version: int | None,
    author: str,
    actor: str | None = None,
) -> AgentDocument:
    """Replace ``old_string``, which must occur exactly once, by ``new_string``, in the version
    stored when the write runs (and only if it is ``expected_version``, when given)."""

    def change(live: str | None) -> str:
        if live is None:
            raise AgentDocNotFoundError(str(path))
        return replaced_once(live, old_string, new_string, path=str(path))

    return get_agent_doc_store().change(
        scope,
        path,
        change,
        action="edit",
        expected_version=expected_version,
        author=_author(author),
        actor=actor,
        limits=doc_limits(),
        now=datetime.now(UTC),
    )


def delete_doc(
    scope: DocScope, path: object, *, expected_version: int | None, author: str, actor: str | None = None
) -> int:
    return get_agent_doc_store().delete(
        scope,
        path,
        expected_version=expected_version,
        author=_author(author),
        actor=actor,
        limits=doc_limits(),
        now=datetime.now(UTC),
    )


def doc_history(
    scope: DocScope,
    path: object | None = None,
    *,
    limit: int = 50,
    offset: int = 0,
    version: int | None = None,
) -> list[DocVersion]:
    """Versions with their text, newest first, at most ``MAX_HISTORY_LIMIT`` a page (each up to
    ``agent_doc_max_chars``); ``version`` picks one version of ``path``."""
    if not 1 <= limit <= MAX_HISTORY_LIMIT or offset < 0:
        raise ValueError(f"limit must be 1-{MAX_HISTORY_LIMIT} and offset at least 0")
    if version is not None and path is None:
        raise ValueError("a version is one document's: name its path")
    return get_agent_doc_store().history(scope, path, limit=limit, offset=offset, version=version)


def doc_summaries(tenant_id: str | None = None) -> list[DocAgentSummary]:
    return get_agent_doc_store().summaries(tenant_id)


def erase_agent_docs(agent_name: str | None, tenant_id: str = DEFAULT_TENANT_ID) -> dict[str, int]:
    """Every document of the agent in the tenant, its users' too, with their history."""
    scope = DocScope(agent_name, None, tenant_id)  # validates both names
    return get_agent_doc_store().erase_agent(scope.tenant_id, scope.agent_name)


def document_fields(doc: AgentDocument) -> dict[str, object]:
    """A document as the CLI's JSON and the HTTP API show it (``content`` only when read)."""
    fields: dict[str, object] = {
        "path": doc.path,
        "version": doc.version,
        "chars": doc.chars,
        "author": doc.author,
        "actor": doc.actor,
        "updatedAt": iso(doc.updated_at),
    }
    if doc.content is not None:
        fields["content"] = doc.content
    return fields


def version_fields(entry: DocVersion) -> dict[str, object]:
    """One version of a document as the CLI's JSON and the HTTP API show it."""
    return {
        "path": entry.path,
        "version": entry.version,
        "action": entry.action,
        "author": entry.author,
        "actor": entry.actor,
        "createdAt": iso(entry.created_at),
        "content": entry.content,
    }
