"""memstore as DeerFlow's own memory storage: one config line, DeerFlow's pipeline unchanged above it.

- DeerFlow at the seed contract: ``memory.storage_class:
  memstore.integrations.deerflow.MemstoreStorage`` (logic in ``seed.py``).
- DeerFlow with DeerMem (HEAD): ``memory.backend_config.storage_class:
  memstore.integrations.deerflow.DeerMemStorage`` (logic in ``deermem.py``).

DeerFlow checks that the class subclasses its own ``MemoryStorage`` ABC, so the two names are
built on first lookup (PEP 562 ``__getattr__``) by mixing that ABC into memstore's class. Importing
this package never imports DeerFlow; looking a class up without DeerFlow installed raises an
``ImportError`` that says so. ``docs/integrations.md`` has the setup and how to verify it.
"""

from __future__ import annotations

import importlib
import threading
import types
from typing import Any

from memstore.errors import RevisionConflictError
from memstore.integrations.deerflow.deermem import DeerMemStore
from memstore.integrations.deerflow.seed import SeedStore

__all__ = ["DeerMemStorage", "DeerMemStore", "MemstoreStorage", "SeedStore"]

SEED_ABC_MODULE = "deerflow.agents.memory.storage"
DEERMEM_ABC_MODULE = "deerflow.agents.memory.backends.deermem.deermem.core.storage"

_built: dict[str, type] = {}
_lock = threading.Lock()


def _deerflow_module(name: str, wanted: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(
            f"memstore.integrations.deerflow.{wanted} needs DeerFlow ({name} could not be imported: "
            f"{exc}); install memstore into DeerFlow's environment"
        ) from exc


def _seed_class() -> type:
    module = _deerflow_module(SEED_ABC_MODULE, "MemstoreStorage")
    return types.new_class(
        "MemstoreStorage",
        (SeedStore, module.MemoryStorage),
        exec_body=lambda ns: ns.update({"__module__": __name__, "__doc__": SeedStore.__doc__}),
    )


def _deermem_class() -> type:
    module = _deerflow_module(DEERMEM_ABC_MODULE, "DeerMemStorage")

    def conflict(name: str, base: type) -> type:
        return types.new_class(
            name, (RevisionConflictError, base), exec_body=lambda ns: ns.update({"__module__": __name__})
        )

    return types.new_class(
        "DeerMemStorage",
        (DeerMemStore, module.MemoryStorage),
        exec_body=lambda ns: ns.update(
            {
                "__module__": __name__,
                "__doc__": DeerMemStore.__doc__,
                "manifest_conflict": conflict(
                    "ManifestRevisionConflict", module.MemoryManifestRevisionConflict
                ),
                "fact_conflict": conflict("FactRevisionConflict", module.MemoryFactRevisionConflict),
            }
        ),
    )


_BUILDERS = {"MemstoreStorage": _seed_class, "DeerMemStorage": _deermem_class}


def __getattr__(name: str) -> type:
    builder = _BUILDERS.get(name)
    if builder is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _lock:
        if name not in _built:
            _built[name] = builder()
        return _built[name]
