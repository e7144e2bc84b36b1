"""The storage contract every provider implements; the pipeline above it depends only on this."""

from __future__ import annotations

from abc import ABC, abstractmethod

from memstore.document import MemoryDocument


class MemoryStorage(ABC):
    """Loads and saves one memory document per scope ``(user_id, agent_name)``.

    Contract shared by all providers (checked by ``tests/integration/test_storage_contract.py``):
    an unknown scope loads as an empty document; ``load`` returns a document the caller may
    mutate without affecting the provider; ``save`` never mutates its argument, sets
    ``lastUpdated`` on what it stores, and returns ``False`` (leaving the previous data
    readable) when it cannot persist; scopes never see each other's data.
    """

    @abstractmethod
    def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        """The scope's document, served from a cache only when it is provably current."""

    @abstractmethod
    def reload(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        """The scope's document read from the backing store, bypassing any cache."""

    @abstractmethod
    def save(
        self, memory: MemoryDocument, agent_name: str | None = None, *, user_id: str | None = None
    ) -> bool:
        """Persist ``memory`` for the scope; ``True`` once it is durable."""
