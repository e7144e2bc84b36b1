"""memstore: long-term memory for multi-user LLM agent gateways, kept in a real SQL database."""

from memstore.config import MemoryConfig, get_memory_config, load_memory_config, set_memory_config
from memstore.document import MemoryDocument, create_empty_memory, utc_now_iso_z
from memstore.errors import ConfigError, InvalidScopeError, MemstoreError
from memstore.facts import (
    DuplicateFactError,
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
from memstore.injection import format_memory_for_injection
from memstore.messages import detect_correction, detect_reinforcement, filter_messages_for_memory
from memstore.middleware import MemoryMiddleware
from memstore.queue import (
    ConversationContext,
    MemoryUpdateQueue,
    get_memory_queue,
    reset_memory_queue,
    set_memory_queue,
)
from memstore.scope import make_safe_user_id
from memstore.storage import FileMemoryStorage, MemoryStorage, get_memory_storage, reset_memory_storage
from memstore.summarization_hook import memory_flush_hook
from memstore.tools import get_memory_tools, memory_add, memory_delete, memory_search, memory_update
from memstore.update_prompt import format_conversation_for_update
from memstore.updater import MemoryUpdater, update_memory_from_conversation
from memstore.user_context import (
    DEFAULT_USER_ID,
    get_effective_user_id,
    reset_current_user,
    set_current_user,
)

__all__ = [
    "DEFAULT_USER_ID",
    "ConfigError",
    "ConversationContext",
    "DuplicateFactError",
    "FileMemoryStorage",
    "InvalidScopeError",
    "MemoryConfig",
    "MemoryDocument",
    "MemoryMiddleware",
    "MemoryStorage",
    "MemoryUpdateQueue",
    "MemoryUpdater",
    "MemstoreError",
    "clear_memory_data",
    "create_empty_memory",
    "create_memory_fact",
    "create_memory_fact_with_created_fact",
    "delete_memory_fact",
    "detect_correction",
    "detect_reinforcement",
    "filter_messages_for_memory",
    "format_conversation_for_update",
    "format_memory_for_injection",
    "get_effective_user_id",
    "get_memory_config",
    "get_memory_data",
    "get_memory_queue",
    "get_memory_storage",
    "get_memory_tools",
    "import_memory_data",
    "load_memory_config",
    "make_safe_user_id",
    "memory_add",
    "memory_delete",
    "memory_flush_hook",
    "memory_search",
    "memory_update",
    "reload_memory_data",
    "reset_current_user",
    "reset_memory_queue",
    "reset_memory_storage",
    "search_memory_facts",
    "set_current_user",
    "set_memory_config",
    "set_memory_queue",
    "update_memory_fact",
    "update_memory_from_conversation",
    "utc_now_iso_z",
]
