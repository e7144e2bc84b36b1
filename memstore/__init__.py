"""memstore: long-term memory for multi-user LLM agent gateways, kept in a real SQL database.

The pipeline runs capture -> queue -> update -> storage, and inject reads storage back into the
prompt; ``docs/architecture.md`` maps each stage to its package.

The names below load on first use (PEP 562), so ``import memstore`` and the ``memstore`` command
start without SQLAlchemy, pydantic or the LLM clients: a command imports only what it runs.
``from memstore import X`` works as before; the ``TYPE_CHECKING`` block shows type checkers and
IDEs the same names, and ``tests/unit/test_package_exports.py`` holds the two lists together.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memstore.capture.conversation import ConversationContext
    from memstore.capture.filtering import filter_messages_for_memory
    from memstore.capture.signals import detect_correction, detect_reinforcement
    from memstore.config import MemoryConfig, get_memory_config, load_memory_config, set_memory_config
    from memstore.document import MemoryDocument, create_empty_memory, utc_now_iso_z
    from memstore.errors import (
        AccessDeniedError,
        ConfigError,
        DuplicateFactError,
        FactEditConflictError,
        FactNotFoundError,
        InvalidDocumentError,
        InvalidFactError,
        InvalidScopeError,
        InvalidTurnError,
        MemstoreError,
        QueryError,
        SessionLimitError,
        SimilarFactError,
        StaleDocumentError,
        StorageUnavailableError,
        StorageWriteError,
    )
    from memstore.gateway.agent_doc_prompt import (
        agent_prompt_baseline_tokens,
        agent_system_prompt,
        load_agent_memory,
    )
    from memstore.gateway.flush_hook import memory_flush_hook
    from memstore.gateway.middleware import MemoryMiddleware
    from memstore.gateway.tools import (
        get_memory_tools,
        memory_add,
        memory_delete,
        memory_search,
        memory_update,
        should_use_memory_tools,
    )
    from memstore.gateway.user_context import (
        get_current_identity,
        get_effective_user_id,
        reset_current_user,
        set_current_user,
    )
    from memstore.inject.render import format_memory_for_injection
    from memstore.ops.facts import (
        clear_memory_data,
        create_memory_fact,
        create_memory_fact_with_created_fact,
        delete_memory_fact,
        get_memory_data,
        import_memory_data,
        reload_memory_data,
        search_memory_facts,
        update_memory_fact,
    )
    from memstore.ops.sessions import append_turns as append_session_turns
    from memstore.ops.sessions import clear_session, list_sessions, read_session, session_context
    from memstore.queue import MemoryUpdateQueue, get_memory_queue, reset_memory_queue, set_memory_queue
    from memstore.scope import DEFAULT_TENANT_ID, DEFAULT_USER_ID, Identity, make_safe_user_id
    from memstore.storage import FileMemoryStorage, MemoryStorage, get_memory_storage, reset_memory_storage
    from memstore.storage.sql import SqlMemoryStorage
    from memstore.update.prompt import format_conversation_for_update
    from memstore.update.updater import MemoryUpdater, update_memory_from_conversation

# Where each public name lives: imported on the first ``memstore.<name>`` and then cached here.
_EXPORTS: dict[str, str] = {
    "ConversationContext": "memstore.capture.conversation",
    "filter_messages_for_memory": "memstore.capture.filtering",
    "detect_correction": "memstore.capture.signals",
    "detect_reinforcement": "memstore.capture.signals",
    "MemoryConfig": "memstore.config",
    "get_memory_config": "memstore.config",
    "load_memory_config": "memstore.config",
    "set_memory_config": "memstore.config",
    "MemoryDocument": "memstore.document",
    "create_empty_memory": "memstore.document",
    "utc_now_iso_z": "memstore.document",
    "AccessDeniedError": "memstore.errors",
    "ConfigError": "memstore.errors",
    "DuplicateFactError": "memstore.errors",
    "FactEditConflictError": "memstore.errors",
    "FactNotFoundError": "memstore.errors",
    "InvalidDocumentError": "memstore.errors",
    "InvalidFactError": "memstore.errors",
    "InvalidScopeError": "memstore.errors",
    "InvalidTurnError": "memstore.errors",
    "MemstoreError": "memstore.errors",
    "QueryError": "memstore.errors",
    "SessionLimitError": "memstore.errors",
    "SimilarFactError": "memstore.errors",
    "StaleDocumentError": "memstore.errors",
    "StorageUnavailableError": "memstore.errors",
    "StorageWriteError": "memstore.errors",
    "agent_prompt_baseline_tokens": "memstore.gateway.agent_doc_prompt",
    "agent_system_prompt": "memstore.gateway.agent_doc_prompt",
    "load_agent_memory": "memstore.gateway.agent_doc_prompt",
    "memory_flush_hook": "memstore.gateway.flush_hook",
    "MemoryMiddleware": "memstore.gateway.middleware",
    "get_memory_tools": "memstore.gateway.tools",
    "memory_add": "memstore.gateway.tools",
    "memory_delete": "memstore.gateway.tools",
    "memory_search": "memstore.gateway.tools",
    "memory_update": "memstore.gateway.tools",
    "should_use_memory_tools": "memstore.gateway.tools",
    "get_current_identity": "memstore.gateway.user_context",
    "get_effective_user_id": "memstore.gateway.user_context",
    "reset_current_user": "memstore.gateway.user_context",
    "set_current_user": "memstore.gateway.user_context",
    "format_memory_for_injection": "memstore.inject.render",
    "clear_memory_data": "memstore.ops.facts",
    "create_memory_fact": "memstore.ops.facts",
    "create_memory_fact_with_created_fact": "memstore.ops.facts",
    "delete_memory_fact": "memstore.ops.facts",
    "get_memory_data": "memstore.ops.facts",
    "import_memory_data": "memstore.ops.facts",
    "reload_memory_data": "memstore.ops.facts",
    "search_memory_facts": "memstore.ops.facts",
    "update_memory_fact": "memstore.ops.facts",
    "append_session_turns": "memstore.ops.sessions",
    "clear_session": "memstore.ops.sessions",
    "list_sessions": "memstore.ops.sessions",
    "read_session": "memstore.ops.sessions",
    "session_context": "memstore.ops.sessions",
    "MemoryUpdateQueue": "memstore.queue",
    "get_memory_queue": "memstore.queue",
    "reset_memory_queue": "memstore.queue",
    "set_memory_queue": "memstore.queue",
    "DEFAULT_TENANT_ID": "memstore.scope",
    "DEFAULT_USER_ID": "memstore.scope",
    "Identity": "memstore.scope",
    "make_safe_user_id": "memstore.scope",
    "FileMemoryStorage": "memstore.storage",
    "MemoryStorage": "memstore.storage",
    "get_memory_storage": "memstore.storage",
    "reset_memory_storage": "memstore.storage",
    "SqlMemoryStorage": "memstore.storage.sql",
    "format_conversation_for_update": "memstore.update.prompt",
    "MemoryUpdater": "memstore.update.updater",
    "update_memory_from_conversation": "memstore.update.updater",
}
# Public names that differ from their name in the defining module.
_RENAMED = {"append_session_turns": "append_turns"}

__all__ = [  # noqa: RUF022 - grouped by stage, not sorted
    # configuration, document and errors
    "MemoryConfig",
    "get_memory_config",
    "load_memory_config",
    "set_memory_config",
    "MemoryDocument",
    "create_empty_memory",
    "utc_now_iso_z",
    "MemstoreError",
    "ConfigError",
    "InvalidScopeError",
    "StorageUnavailableError",
    "StorageWriteError",
    "StaleDocumentError",
    "InvalidTurnError",
    "SessionLimitError",
    "FactNotFoundError",
    "DuplicateFactError",
    "SimilarFactError",
    "FactEditConflictError",
    "InvalidFactError",
    "InvalidDocumentError",
    "QueryError",
    "AccessDeniedError",
    # capture
    "ConversationContext",
    "filter_messages_for_memory",
    "detect_correction",
    "detect_reinforcement",
    # queue
    "MemoryUpdateQueue",
    "get_memory_queue",
    "set_memory_queue",
    "reset_memory_queue",
    # update
    "MemoryUpdater",
    "update_memory_from_conversation",
    "format_conversation_for_update",
    # storage
    "MemoryStorage",
    "FileMemoryStorage",
    "SqlMemoryStorage",
    "get_memory_storage",
    "reset_memory_storage",
    # inject
    "format_memory_for_injection",
    # gateway
    "MemoryMiddleware",
    "memory_flush_hook",
    "DEFAULT_USER_ID",
    "DEFAULT_TENANT_ID",
    "Identity",
    "get_effective_user_id",
    "get_current_identity",
    "set_current_user",
    "reset_current_user",
    "make_safe_user_id",
    "get_memory_tools",
    "should_use_memory_tools",
    "memory_search",
    "memory_add",
    "memory_update",
    "memory_delete",
    # the agent's own memory document in its system prompt
    "load_agent_memory",
    "agent_system_prompt",
    "agent_prompt_baseline_tokens",
    # operations on stored memory
    "get_memory_data",
    "reload_memory_data",
    "import_memory_data",
    "clear_memory_data",
    "create_memory_fact",
    "create_memory_fact_with_created_fact",
    "update_memory_fact",
    "delete_memory_fact",
    "search_memory_facts",
    # short-term session memory
    "append_session_turns",
    "session_context",
    "read_session",
    "list_sessions",
    "clear_session",
]


if not TYPE_CHECKING:  # type checkers see the names above, so they still flag a misspelt import

    def __getattr__(name: str) -> Any:
        """Import ``name``'s module on first use and keep the value, so later lookups are plain."""
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), _RENAMED.get(name, name))
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
