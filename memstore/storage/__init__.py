"""Storage providers and the contract they share."""

from memstore.storage.base import MemoryStorage
from memstore.storage.file import FileMemoryStorage
from memstore.storage.loader import get_memory_storage, load_storage_class, reset_memory_storage

__all__ = [
    "FileMemoryStorage",
    "MemoryStorage",
    "get_memory_storage",
    "load_storage_class",
    "reset_memory_storage",
]
