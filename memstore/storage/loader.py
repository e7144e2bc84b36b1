"""Builds the configured ``storage_class`` once per process.

A class that cannot be loaded is a startup error, never a fallback: a silent fallback is
how the reference ended up writing memory to the wrong place.
"""

from __future__ import annotations

import importlib
import threading

from memstore.async_face import held
from memstore.config import get_memory_config
from memstore.errors import ConfigError
from memstore.storage.base import MemoryStorage

_storage: MemoryStorage | None = None
_storage_lock = threading.Lock()


def load_storage_class(dotted_path: str) -> type[MemoryStorage]:
    module_name, _, class_name = dotted_path.rpartition(".")
    if not module_name or not class_name:
        raise ConfigError(f"storage_class {dotted_path!r} is not a dotted class path")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"storage_class {dotted_path!r}: cannot import module {module_name!r}: {exc}"
        ) from exc
    candidate = getattr(module, class_name, None)
    if candidate is None:
        raise ConfigError(f"storage_class {dotted_path!r}: module {module_name!r} has no {class_name!r}")
    if not isinstance(candidate, type):
        raise ConfigError(f"storage_class {dotted_path!r} is not a class")
    if not issubclass(candidate, MemoryStorage):
        raise ConfigError(f"storage_class {dotted_path!r} is not a subclass of memstore.MemoryStorage")
    return candidate


def get_memory_storage() -> MemoryStorage:
    """The process-wide provider, built on first use (thread-safe)."""
    global _storage
    with held(_storage_lock):  # building it may read the database: on the async face, yield meanwhile
        if _storage is None:
            storage_class = load_storage_class(get_memory_config().storage_class)
            _storage = storage_class()
        return _storage


def reset_memory_storage() -> None:
    """Drop the provider so the next call builds one from the current config."""
    global _storage
    with _storage_lock:
        close = getattr(_storage, "close", None)
        _storage = None
    if callable(close):
        close()
