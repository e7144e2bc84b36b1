"""Stand-ins for the DeerFlow modules the DeerFlow adapters mix in, for CI without DeerFlow.

DeerFlow is not on PyPI and CI has no network. These modules copy ONLY DeerFlow's published
names and method signatures (the seed ``MemoryStorage`` ABC at 8e96a6a25, DeerMem's
``MemoryStorage`` ABC and conflict exceptions at f1f4af99, ``get_memory_config().max_facts``),
with no bodies: none of DeerFlow's code. ``install()`` registers them under DeerFlow's module names.
"""

from __future__ import annotations

import abc
import sys
import types
from dataclasses import dataclass
from datetime import datetime
from typing import Any

SEED_STORAGE = "deerflow.agents.memory.storage"
DEERMEM_STORAGE = "deerflow.agents.memory.backends.deermem.deermem.core.storage"
SEED_CONFIG = "deerflow.config.memory_config"


class SeedMemoryStorage(abc.ABC):
    """The seed's ``deerflow.agents.memory.storage.MemoryStorage`` signatures."""

    @abc.abstractmethod
    def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> dict[str, Any]: ...

    @abc.abstractmethod
    def reload(self, agent_name: str | None = None, *, user_id: str | None = None) -> dict[str, Any]: ...

    @abc.abstractmethod
    def save(
        self, memory_data: dict[str, Any], agent_name: str | None = None, *, user_id: str | None = None
    ) -> bool: ...


class MemoryStorageError(RuntimeError):
    pass


class MemoryRevisionConflict(MemoryStorageError):
    pass


class MemoryManifestRevisionConflict(MemoryRevisionConflict):
    pass


class MemoryFactRevisionConflict(MemoryRevisionConflict):
    pass


class DeerMemMemoryStorage(abc.ABC):
    """DeerMem's ``core.storage.MemoryStorage`` signatures (abstract ones and the optional hooks)."""

    @abc.abstractmethod
    def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> dict[str, Any]: ...

    @abc.abstractmethod
    def reload(self, agent_name: str | None = None, *, user_id: str | None = None) -> dict[str, Any]: ...

    @abc.abstractmethod
    def save(
        self,
        memory_data: dict[str, Any],
        agent_name: str | None = None,
        *,
        user_id: str | None = None,
        expected_revision: int | None = None,
    ) -> bool: ...

    def apply_changes(self, change_set: dict[str, Any], **scope: Any) -> dict[str, Any]:
        raise NotImplementedError

    def clear_all(self, *, user_id: str | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def get_fact_usage(self, *, agent_name: str, user_id: str | None = None) -> dict[str, dict[str, Any]]:
        return {}

    def record_fact_accesses(
        self,
        fact_ids: list[str],
        *,
        agent_name: str,
        user_id: str | None = None,
        accessed_at: datetime | None = None,
    ) -> None:
        return None

    def close(self) -> None:
        return None


@dataclass
class SeedMemoryConfig:
    max_facts: int = 100


seed_config = SeedMemoryConfig()


def _module(name: str, **members: Any) -> None:
    parts = name.split(".")
    for depth in range(1, len(parts)):
        sys.modules.setdefault(".".join(parts[:depth]), types.ModuleType(".".join(parts[:depth])))
    module = types.ModuleType(name)
    module.__dict__.update(members)
    sys.modules[name] = module


def install() -> None:
    """Register the stand-ins (idempotent)."""
    if SEED_STORAGE in sys.modules:
        return
    _module(SEED_STORAGE, MemoryStorage=SeedMemoryStorage)
    _module(
        DEERMEM_STORAGE,
        MemoryStorage=DeerMemMemoryStorage,
        MemoryStorageError=MemoryStorageError,
        MemoryRevisionConflict=MemoryRevisionConflict,
        MemoryManifestRevisionConflict=MemoryManifestRevisionConflict,
        MemoryFactRevisionConflict=MemoryFactRevisionConflict,
    )
    _module(SEED_CONFIG, get_memory_config=lambda: seed_config)
