"""The durable queue from Python and the CLI: its status, and retrying or purging dead rows.

Only the SQL provider has one; any other provider gets a ``ConfigError`` that says so. These
cross tenants, so they run on the operator connection (``operator_database_url``) and refuse,
naming it, a connection that row-level security binds.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from memstore.config import get_memory_config
from memstore.errors import ConfigError, StorageUnavailableError
from memstore.queue.bounds import table_limits
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.sql.documents.provider import SqlMemoryStorage
from memstore.storage.sql.maintenance.operator import operator_engine
from memstore.storage.sql.queue import admin as queue_admin
from memstore.storage.sql.queue.admin import QueueStatus

T = TypeVar("T")


def _sql(storage: MemoryStorage | None) -> SqlMemoryStorage:
    storage = storage or get_memory_storage()
    if not isinstance(storage, SqlMemoryStorage):
        raise ConfigError(
            "the durable queue lives in the SQL provider's database; "
            f"storage_class is {type(storage).__name__}"
        )
    return storage


def _run(storage: MemoryStorage | None, work: Callable[[Connection, datetime], T], *, write: bool) -> T:
    sql = _sql(storage)
    try:
        engine = operator_engine(sql.engine, "the queue's status, retry and purge")
        with engine.connect() as conn:
            if not write:
                return work(conn, datetime.now(UTC))
            with conn.begin():
                return work(conn, datetime.now(UTC))
    except DBAPIError as exc:
        raise StorageUnavailableError(f"cannot reach the queue at {sql.url}: {exc.orig}") from exc


def queue_status(storage: MemoryStorage | None = None) -> QueueStatus:
    """Pending, due, leased and dead rows, the oldest waiting turn's age, and recent throughput."""
    limits = table_limits(get_memory_config())
    return _run(storage, lambda conn, now: queue_admin.queue_status(conn, now, limits), write=False)


def retry_dead(ids: list[int] | None = None, storage: MemoryStorage | None = None) -> int:
    """Queue dead conversations (all, or ``ids``) again, due now; returns how many."""
    return _run(storage, lambda conn, now: queue_admin.retry_dead(conn, now, ids), write=True)


def purge_counts(
    ids: list[int] | None = None, storage: MemoryStorage | None = None
) -> list[tuple[str, str, int]]:
    """The dead conversations ``purge_dead`` would delete, as ``(state, user_id, rows)``."""
    return _run(storage, lambda conn, _now: queue_admin.purge_counts(conn, ids), write=False)


def purge_dead(ids: list[int] | None = None, storage: MemoryStorage | None = None) -> int:
    """Delete dead conversations (all, or ``ids``); returns how many."""
    return _run(storage, lambda conn, _now: queue_admin.purge_dead(conn, ids), write=True)
