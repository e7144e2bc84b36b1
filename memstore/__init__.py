"""memstore: long-term memory for multi-user LLM agent gateways, kept in a real SQL database."""

from memstore.config import MemoryConfig, get_memory_config, load_memory_config, set_memory_config
from memstore.document import MemoryDocument, create_empty_memory, utc_now_iso_z
from memstore.errors import ConfigError, InvalidScopeError, MemstoreError
from memstore.scope import make_safe_user_id
from memstore.storage import FileMemoryStorage, MemoryStorage, get_memory_storage, reset_memory_storage
from memstore.user_context import (
    DEFAULT_USER_ID,
    get_effective_user_id,
    reset_current_user,
    set_current_user,
)

__all__ = [
    "DEFAULT_USER_ID",
    "ConfigError",
    "FileMemoryStorage",
    "InvalidScopeError",
    "MemoryConfig",
    "MemoryDocument",
    "MemoryStorage",
    "MemstoreError",
    "create_empty_memory",
    "get_effective_user_id",
    "get_memory_config",
    "get_memory_storage",
    "load_memory_config",
    "make_safe_user_id",
    "reset_current_user",
    "reset_memory_storage",
    "set_current_user",
    "set_memory_config",
    "utc_now_iso_z",
]
