"""Connections for a store whose every call runs as one identity: the sessions and agent documents.

A write is one transaction that starts by setting its identity and timeouts (PostgreSQL, where the
row-level security applies; only the timeouts where it does not) or, on SQLite, takes the write
lock at ``BEGIN`` (``BEGIN IMMEDIATE``), so writers of one row take turns without deadlocks. A
read runs on the autocommit reader with the identity set in its opening round trip. A database
that does not answer becomes the store's ``unavailable`` error, naming the masked URL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from memstore.config import get_memory_config
from memstore.errors import StorageUnavailableError
from memstore.scope import Identity
from memstore.storage.sql.documents.statements import WRITE_TIMEOUTS
from memstore.storage.sql.engine import (
    SQLITE_BUSY_TIMEOUT_OPTION,
    SQLITE_WRITE_OPTION,
    describe_db_error,
    engine_for,
    get_engine,
    is_outage,
    mask_url,
)
from memstore.storage.sql.identity import TIMEOUTS_AND_IDENTITY, identity_parameters, policies_apply, reading
from memstore.storage.sql.schema.migrate import prepare_once

Unavailable = Callable[[str], StorageUnavailableError]


class ScopedConnections:
    """The engine of ``database_url`` (migrated when ``auto_migrate``), and its read and write
    transactions; ``unavailable(message)`` builds the error an outage becomes."""

    def __init__(self, database_url: str, unavailable: Unavailable, what: str) -> None:
        config = get_memory_config()
        self.url = database_url
        self._unavailable_error = unavailable
        self._what = what
        self._sync_engine = get_engine(database_url)
        self._sync_reader = (
            self._sync_engine.execution_options(isolation_level="AUTOCOMMIT")
            if self._sync_engine.dialect.name == "postgresql"
            else self._sync_engine
        )
        lock_ms = round(config.write_lock_timeout_seconds * 1000)
        self.write_options = {SQLITE_WRITE_OPTION: True, SQLITE_BUSY_TIMEOUT_OPTION: lock_ms}
        # A stuck lock on one row costs its own write an error, not a replica's threads a wait.
        self._pg_timeouts = {
            "lock_timeout": f"{lock_ms}ms",
            "statement_timeout": f"{round(config.write_statement_timeout_seconds * 1000)}ms",
        }
        try:
            prepare_once(self.engine, auto_migrate=config.auto_migrate)
        except DBAPIError as exc:
            raise self.unavailable(exc, "open") from exc

    @property
    def engine(self) -> Engine:
        """The engine of the calling face (``engine_for``): the sync one, or the loop's async one."""
        return engine_for(self._sync_engine)

    @property
    def _reader(self) -> Engine:
        return engine_for(self._sync_reader)

    def unavailable(self, exc: Exception, doing: str) -> StorageUnavailableError:
        return self._unavailable_error(
            f"cannot {doing} {self._what} at {mask_url(self.url)}: {describe_db_error(exc)}"
        )

    @contextmanager
    def guard(self, doing: str) -> Iterator[None]:
        try:
            yield
        except DBAPIError as exc:
            if is_outage(exc):
                raise self.unavailable(exc, doing) from exc
            raise

    @contextmanager
    def write(self, identity: Identity, doing: str) -> Iterator[Connection]:
        with self.guard(doing), self.engine.connect() as conn:
            conn.execution_options(**self.write_options)
            with conn.begin():
                if conn.dialect.name == "postgresql" and policies_apply(self.engine, conn):
                    conn.execute(
                        TIMEOUTS_AND_IDENTITY, {**self._pg_timeouts, **identity_parameters(identity)}
                    )
                elif conn.dialect.name == "postgresql":
                    conn.execute(WRITE_TIMEOUTS, self._pg_timeouts)
                yield conn

    @contextmanager
    def read(self, identity: Identity, doing: str = "read") -> Iterator[Connection]:
        with self.guard(doing), reading(self.engine, self._reader, identity) as conn:
            yield conn
