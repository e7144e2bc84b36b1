"""memstore: long-term memory for multi-user LLM agent gateways, kept in a real SQL database.

The pipeline runs capture -> queue -> update -> storage, and inject reads storage back into the
prompt; ``docs/architecture.md`` maps each stage to its package.
"""

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
