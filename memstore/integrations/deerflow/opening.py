"""Opening memstore's SQL provider on first use, loudly.

DeerFlow's seed loader catches any exception from a storage constructor and silently falls back
to ``FileMemoryStorage``, so the adapters' constructors never touch the database. The first load
or save opens it: a setup problem (no schema, a URL that cannot work) raises ``StorageSetupError``
naming the DeerFlow setting and the memstore command that fixes it, on every call until fixed; an
unreachable database raises ``StorageUnavailableError`` and the next call tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from memstore.errors import MemstoreError, StorageSetupError, StorageUnavailableError
from memstore.storage.sql import SqlMemoryStorage

logger = logging.getLogger("memstore.integrations.deerflow")

FIX_HINT = (
    "set MEMSTORE_DATABASE_URL (or database_url in the file MEMSTORE_CONFIG names) in DeerFlow's "
    "environment and run `memstore db upgrade` against it"
)


class LazySql:
    """One ``SqlMemoryStorage``, built at first use; ``setting`` is the DeerFlow key that chose us."""

    def __init__(
        self, setting: str, *, database_url: str | None, max_facts: Callable[[], int | None]
    ) -> None:
        self._setting = setting
        self._database_url = database_url
        self._max_facts = max_facts
        self._storage: SqlMemoryStorage | None = None
        self._lock = threading.Lock()

    def get(self) -> SqlMemoryStorage:
        storage = self._storage
        if storage is not None:
            return storage
        with self._lock:
            if self._storage is None:
                self._storage = self._open()
            return self._storage

    @property
    def opened(self) -> SqlMemoryStorage | None:
        return self._storage

    def _open(self) -> SqlMemoryStorage:
        try:
            max_facts = self._max_facts()
            storage = SqlMemoryStorage(self._database_url, max_facts=max_facts)
        except StorageUnavailableError:
            raise
        except (MemstoreError, ArgumentError, SQLAlchemyError) as exc:
            message = f"memstore storage ({self._setting}) cannot open its database: {exc}; {FIX_HINT}"
            logger.error("%s", message)
            raise StorageSetupError(message) from exc
        logger.info(
            "memstore is DeerFlow's memory storage (%s): database %s, max_facts %s",
            self._setting,
            storage.url,
            max_facts if max_facts is not None else "memstore's default",
        )
        return storage
