"""Readiness of a memstore service in a fleet: what ``/readyz`` answers, one check at a time.

A replica is ready when its database answers and the schema is at the head this code ships (a
replica behind a migration would fail its first save). The durable queue's lag is reported beside
the checks, never as one: the queue is the workers' job, and a load balancer that took every API
replica out of rotation because the workers were down would turn a backlog into an outage. Alert
on the lag instead (``memstore_queue_oldest_pending_seconds`` on ``/metrics``). The answer is for
unauthenticated probes, so a failed check names what failed, never the driver's message: that
goes to the log once per failure, at WARNING, with the URL's password masked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.exc import DBAPIError

from memstore.config import get_memory_config
from memstore.errors import ConfigError, MigrationError
from memstore.queue.bounds import table_limits
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.sql.documents.provider import SqlMemoryStorage
from memstore.storage.sql.maintenance.operator import operator_engine
from memstore.storage.sql.queue import admin as queue_admin
from memstore.storage.sql.schema import migrate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Readiness:
    checks: tuple[Check, ...]
    queue: Check | None = None
    """The durable queue's lag (``ok`` while under ``ready_max_queue_lag_seconds``): reported, not a check."""

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks)


def readiness(storage: MemoryStorage | None = None) -> Readiness:
    """Database reachable and schema at head (no database: ready); the queue's lag beside them."""
    storage = storage or get_memory_storage()
    if not isinstance(storage, SqlMemoryStorage):
        return Readiness((Check("storage", True, f"{type(storage).__name__} keeps no database"),))
    try:
        found = migrate.current_of(storage.engine)
    except DBAPIError as exc:
        logger.warning("readiness: cannot reach the database at %s: %s", storage.url, first_line(exc))
        return Readiness((Check("database", False, "unreachable"),))
    target = migrate.head()
    checks = (
        Check("database", True, "reachable"),
        Check("schema", found == target, f"at {found or '<base>'}, head is {target}"),
    )
    if found != target:
        logger.warning("readiness: the database at %s is at %s, head is %s", storage.url, found, target)
        return Readiness(checks)
    if get_memory_config().queue_backend in (None, "database"):
        return Readiness(checks, _queue_lag(storage))
    return Readiness(checks)


def _queue_lag(storage: SqlMemoryStorage) -> Check:
    """Every tenant's queue, read on the operator's connection: under PostgreSQL's row-level
    security the application's role sees no row, and would report an empty queue."""
    config = get_memory_config()
    limit = config.ready_max_queue_lag_seconds
    try:
        with operator_engine(storage.engine, "reading the queue").connect() as conn:
            lag = queue_admin.queue_status(
                conn, datetime.now(UTC), table_limits(config)
            ).oldest_pending_seconds
    except ConfigError:
        return Check("queue", True, "not measured: no operator_database_url to read every tenant's rows")
    except (DBAPIError, MigrationError) as exc:
        logger.warning("readiness: cannot read the queue at %s: %s", storage.url, first_line(exc))
        return Check("queue", False, "unreadable")
    if lag is None:
        return Check("queue", True, "nothing waiting")
    detail = f"oldest waiting turn {lag:.0f} s, limit {limit:.0f} s"
    if lag > limit:
        logger.warning(
            "readiness: the queue at %s lags (the workers are behind or down): %s", storage.url, detail
        )
    return Check("queue", lag <= limit, detail)


def first_line(error: BaseException) -> str:
    """The first line of the driver's message (memstore's, for its own errors), without the SQL."""
    cause = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]
