"""Opening memstore's SQL provider on first use, loudly.

DeerFlow's seed loader catches any exception from a storage constructor and silently falls back
to ``FileMemoryStorage``, so the adapters' constructors never touch the database. The first load
or save opens it: a setup problem (no schema, a URL that cannot work) raises ``StorageSetupError``
naming the DeerFlow setting and the memstore command that fixes it, on every call until fixed; an
unreachable database raises ``StorageUnavailableError`` and the next call tries again. A SQLite
file that cannot be opened (missing where it may not be created, a folder in its place) is a setup
problem: retrying does not make it appear.

``logs_outage`` puts an outage on memstore's logger as it leaves an adapter: DeerFlow logs it in
its own words, or not at all, and memstore's operators watch memstore's logger.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from memstore.errors import MemstoreError, StorageSetupError, StorageUnavailableError
from memstore.storage.sql import SqlMemoryStorage

logger = logging.getLogger("memstore.integrations.deerflow")

P = ParamSpec("P")
R = TypeVar("R")

FIX_HINT = (
    "set MEMSTORE_DATABASE_URL (or database_url in the file MEMSTORE_CONFIG names) in DeerFlow's "
    "environment and run `memstore db upgrade` against it"
)


class LazySql:
    """One ``SqlMemoryStorage``, built at first use; ``setting`` is the DeerFlow key that chose us.

    ``tenant_id`` (default: the default tenant) is the tenant every call acts in.
    """

    def __init__(
        self,
        setting: str,
        *,
        database_url: str | None,
        max_facts: Callable[[], int | None],
        tenant_id: str | None = None,
    ) -> None:
        self._setting = setting
        self._tenant_id = tenant_id
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
            storage = SqlMemoryStorage(self._database_url, max_facts=max_facts).for_identity(self._tenant_id)
        except StorageUnavailableError as exc:
            if not _sqlite_cannot_open(exc):
                raise
            raise self._setup_error(f"{exc} (no SQLite database there, and none can be created)") from exc
        except (MemstoreError, ArgumentError, SQLAlchemyError) as exc:
            raise self._setup_error(str(exc)) from exc
        logger.info(
            "memstore is DeerFlow's memory storage (%s): database %s, max_facts %s",
            self._setting,
            storage.url,
            max_facts if max_facts is not None else "memstore's default",
        )
        return storage

    def _setup_error(self, reason: str) -> StorageSetupError:
        message = f"memstore storage ({self._setting}) cannot open its database: {reason}; {FIX_HINT}"
        logger.error("%s", message)
        return StorageSetupError(message)


def _sqlite_cannot_open(exc: StorageUnavailableError) -> bool:
    """Whether SQLite answered CANTOPEN: the file is missing and may not be made, or is a folder."""
    driver_error = getattr(exc.__cause__, "orig", None)
    return getattr(driver_error, "sqlite_errorname", None) == "SQLITE_CANTOPEN"


def logs_outage(doing: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Log a ``StorageUnavailableError`` leaving the decorated method on memstore's logger, then raise it.

    The log names the operation and the (masked) database, never the user.
    """

    def decorate(method: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(method)
        def logged(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return method(*args, **kwargs)
            except StorageUnavailableError as exc:
                logger.error("memstore: DeerFlow's memory %s failed, database unreachable: %s", doing, exc)
                raise

        return logged

    return decorate
