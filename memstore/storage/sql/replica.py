"""Read replicas (``database_read_url``): which database serves a read of the SQL provider.

The provider's cold loads, searches and queries run on the replica, a PostgreSQL hot standby of
``database_url``; writes, the revision checks that guard them (a save's locked scope row), the
explicit fresh read (``reload``) and the retention signals a save ranks with stay on the primary.

**Reading your own writes.** A replica replays the primary's changes a little later. What this
process wrote and the replica may not show yet is remembered per process and pair of URLs, shared
by every storage on them (``replica_pending.py``: the bounds, and what happens past them):

- a load of a scope is answered again by the primary when the replica's scope row is older than
  this process's save of it, still holds a row it erased, lacks the scope while this process last
  read it, or is older than what this process last read of it (a load never goes back in time);
- a read confined to one user's own scopes (their scope list, a fact's relations, a scope's
  vectors) first asks the replica for the revisions of that user's pending scopes (one indexed
  statement) and runs on the primary unless every one has caught up;
- any other read in a tenant (visible facts, fact queries, full-text and semantic search, history,
  the tenant's scope list: anything that can return another user's shared or public facts) waits
  the same way for every pending scope of that tenant, since a save may have changed whom a fact
  is shared with and an erase removes a user's public facts;
- a write that moves no revision (vectors stored, a save that only confirms facts, the clear of an
  empty scope) holds back the tenant's reads other than loads until the replica has replayed the
  primary's WAL position after its commit.

Another process's writes show up on the replica as its lag allows.

**The replica unable to serve.** A read the replica cannot serve is answered by the primary, never
raised while the primary is up. An outage (connection refused, lost or timed out, no answer within
``replica_deadline.READ_DEADLINE_SECONDS``) is logged once; the replica is then skipped and tried
again after a back-off (1 s, doubling to 30 s), and its return is logged. A recovery conflict (the
standby cancelled the read to replay WAL) or any other database error there (a table the replica
has not replayed a migration for yet) retries that read on the primary without the back-off, logged
at most once a minute per kind. A replica whose role row-level security binds differently from
the primary's (say a superuser replica URL behind a bound application role) would read without
the policies: the first read that needs it checks this and, when they differ, logs an ERROR and
sends every read to the primary for the life of the process.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, Protocol, TypeVar

from prometheus_client import Counter
from sqlalchemy import Connection, Engine, func, literal_column, select, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from memstore.metrics import REGISTRY
from memstore.scope import Identity
from memstore.storage.sql.engine import describe_db_error, engine_for, get_engine, is_outage, mask_url
from memstore.storage.sql.identity import policies_apply, reading
from memstore.storage.sql.replica_deadline import Severer, replica_url
from memstore.storage.sql.replica_pending import (
    ERASED,
    MAX_CHECKED_SCOPES,
    ScopeKey,
    pending_for,
)
from memstore.storage.sql.schema.models import scopes_table as _scopes

BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0
NOTE_INTERVAL_SECONDS = 60.0

READS = Counter(
    "memstore_replica_reads",
    "Reads of the SQL provider with database_read_url, by what served them: replica, primary (the "
    "replica was behind this process's own writes), fallback (the replica could not serve it: "
    "unreachable, a recovery conflict, an error there, or refused for its row-level security)",
    ["served_by"],
    registry=REGISTRY,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Stamped(Protocol):
    """What a load answers (the provider's cache entry): its scope row id and revision first."""

    @property
    def stamp(self) -> tuple[int, int, datetime]: ...


S = TypeVar("S", bound=Stamped)
Connect = Callable[[], AbstractContextManager[Connection]]

_EMPTY: Any = literal_column("''")
_INSERTED = text("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
_REPLAYED = text(
    "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
    "ELSE pg_current_wal_insert_lsn() END - '0/0'::pg_lsn"
)
RECOVERY_CONFLICT = "40001"


class ReplicaFailed(Exception):
    """The replica could not serve this read (internal: the router answers it from the primary)."""


class _Health:
    """One replica in this process: when to try it again, whether it is down, and its deadline."""

    def __init__(self, shown: str) -> None:
        self.shown = shown
        self.severer = Severer()
        self._lock = threading.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._noted: dict[str, float] = {}

    def usable(self) -> bool:
        with self._lock:
            return self._failures == 0 or time.monotonic() >= self._retry_at

    def failed(self, reason: str) -> None:
        with self._lock:
            self._failures += 1
            delay = min(BACKOFF_MAX_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** min(self._failures - 1, 16))
            self._retry_at = time.monotonic() + delay
            first = self._failures == 1
        if first:
            logger.warning(
                "read replica %s unreachable, its reads go to the primary (tried again with back-off): %s",
                self.shown,
                reason,
            )

    def note(self, kind: str, reason: str) -> None:
        """A read the replica refused (not an outage): logged at most once a minute per kind."""
        now = time.monotonic()
        with self._lock:
            if now < self._noted.get(kind, 0.0):
                return
            self._noted[kind] = now + NOTE_INTERVAL_SECONDS
        logger.warning("read replica %s could not serve a read, the primary did: %s", self.shown, reason)

    def served(self) -> None:
        with self._lock:
            was_down, self._failures = self._failures > 0, 0
        if was_down:
            logger.info("read replica %s serves reads again", self.shown)


_health: dict[tuple[int, str], _Health] = {}
_health_lock = threading.Lock()


def _health_of(url: URL) -> _Health:
    key = (os.getpid(), url.render_as_string(hide_password=False))
    with _health_lock:
        health = _health.get(key)
        if health is None:
            health = _health[key] = _Health(mask_url(url))
        return health


def _autocommit(engine: Engine) -> Engine:
    """PostgreSQL reads run in autocommit: no BEGIN/ROLLBACK round trips around one SELECT."""
    if engine.dialect.name == "postgresql":
        return engine.execution_options(isolation_level="AUTOCOMMIT")
    return engine


def _recovery_conflict(exc: DBAPIError) -> bool:
    code = getattr(exc.orig, "sqlstate", None)
    return code == RECOVERY_CONFLICT or "conflict with recovery" in str(exc.orig)


class ReadRouter:
    """The primary's engine and, with ``read_url``, the replica's; ``run`` sends a read to one."""

    def __init__(self, engine: Engine, read_url: str | None = None) -> None:
        self.engine = engine
        self.reader = _autocommit(engine)
        self._replica: Engine | None = None
        self._replica_reader: Engine | None = None
        self._health: _Health | None = None
        self._read_url = read_url
        primary_url = engine.url.render_as_string(hide_password=False)
        self._pending = pending_for(primary_url, read_url or "")
        if read_url is not None:
            url = replica_url(read_url)
            self._replica = get_engine(url)
            self._replica_reader = _autocommit(self._replica)
            self._health = _health_of(url)
            self._pending = pending_for(primary_url, url.render_as_string(hide_password=False))

    @property
    def replicated(self) -> bool:
        return self._replica is not None

    def primary(self, identity: Identity, *, stream: bool = False) -> AbstractContextManager[Connection]:
        """A read on the primary (``stream``: in a transaction, for a server-side cursor)."""
        engine = engine_for(self.engine)
        return reading(engine, engine if stream else engine_for(self.reader), identity)

    @contextmanager
    def _on_replica(self, identity: Identity, stream: bool) -> Iterator[Connection]:
        assert self._replica is not None and self._replica_reader is not None and self._health is not None
        if self._pending.refused is not None or not self._health.usable():
            raise ReplicaFailed
        engine = engine_for(self._replica)
        reader = engine if stream else engine_for(self._replica_reader)
        health = self._health
        health.severer.watch(engine)
        try:
            with health.severer.deadline():
                self._check_policies(engine)
                with reading(engine, reader, identity) as conn:
                    yield conn
        except DBAPIError as exc:
            reason = describe_db_error(exc, url=self._read_url)
            if _recovery_conflict(exc):
                health.note("recovery conflict", reason)
            elif is_outage(exc):
                health.failed(reason)
            else:
                health.note(type(exc.orig).__name__, reason)
            raise ReplicaFailed from exc
        except SQLAlchemyError as exc:  # the pool's own timeout or disconnection
            if not is_outage(exc):
                raise
            health.failed(describe_db_error(exc, url=self._read_url))
            raise ReplicaFailed from exc

    def _check_policies(self, replica: Engine) -> None:
        """Refuse a replica whose role row-level security binds differently from the primary's."""
        if self._pending.checked:
            return
        primary, secondary = policies_apply(engine_for(self.engine)), policies_apply(replica)
        if primary != secondary:
            assert self._health is not None
            self._pending.refused = (
                f"row-level security binds the role of {'database_url' if primary else 'database_read_url'} "
                f"but not that of {'database_read_url' if primary else 'database_url'}"
            )
            logger.error(
                "read replica %s refused, every read goes to the primary: %s; give both URLs the same "
                "role (or roles equally bound) and restart",
                self._health.shown,
                self._pending.refused,
            )
            raise ReplicaFailed
        self._pending.checked = True

    def run(
        self, identity: Identity, read: Callable[[Connect], T], *, stream: bool = False, own: bool = False
    ) -> T:
        """``read`` on the replica when it holds this process's writes the read can see, else on
        the primary; ``own``: the read is confined to ``identity.user_id``'s own scopes."""
        return self._serve(identity, read, stream, lambda on_replica: self._ready(on_replica, identity, own))

    def load(
        self, identity: Identity, key: ScopeKey, read: Callable[[Connect], S | None], cached: S | None
    ) -> S | None:
        """A load of the scope ``key`` (None: no such scope), re-served by the primary when the
        replica's answer misses this process's writes of it or is older than ``cached``, what this
        process last read of it."""
        known = None if cached is None else cached.stamp[:2]

        def fresh(result: S | None) -> bool:
            seen = None if result is None else result.stamp[:2]
            if known is not None and (seen is None or seen < known):
                return False
            return self._pending.settle(key, {} if seen is None else {seen[0]: seen[1]})

        return self._serve(identity, read, False, lambda _: not self._pending.held(key[0]), fresh)

    def _serve(
        self,
        identity: Identity,
        read: Callable[[Connect], T],
        stream: bool,
        ready: Callable[[Connect], bool],
        fresh: Callable[[T], bool] | None = None,
    ) -> T:
        def on_primary() -> AbstractContextManager[Connection]:
            return self.primary(identity, stream=stream)

        if self._health is None:
            return read(on_primary)

        def on_replica() -> AbstractContextManager[Connection]:
            return self._on_replica(identity, stream)

        try:
            if not ready(on_replica):
                READS.labels("primary").inc()
                return read(on_primary)
            result = read(on_replica)
        except ReplicaFailed:
            READS.labels("fallback").inc()
            return read(on_primary)
        self._health.served()
        if fresh is not None and not fresh(result):
            READS.labels("primary").inc()
            return read(on_primary)
        READS.labels("replica").inc()
        return result

    def wrote(self, key: ScopeKey, scope_id: int, revision: int) -> None:
        """This process saved the scope (row ``scope_id``) at ``revision``: its reads wait for the
        replica to show that row at that revision or later."""
        if self._health is not None:
            self._pending.wait(key, (scope_id, revision))

    def committed(self, tenant_id: str) -> None:
        """This process committed a write that moves no revision: the tenant's reads wait for the
        replica to replay the primary's WAL up to its position now (past that commit); with the
        position unknown (the primary just went away), they go to the primary for a while."""
        if self._health is None:
            return
        try:
            with engine_for(self.reader).connect() as conn:
                position = int(conn.execute(_INSERTED).scalar_one())
        except SQLAlchemyError:
            self._pending.hold(tenant_id)
            return
        self._pending.wait_position(tenant_id, position)

    def erased(self, tenant_id: str, user_id: str, scopes: Iterable[tuple[str | None, int]]) -> None:
        """This process erased the user's scopes (``(agent_name, row id)``): reads wait for the
        replica to have dropped those rows."""
        if self._health is not None:
            for agent_name, scope_id in scopes:
                self._pending.wait((tenant_id, user_id, agent_name), (scope_id, ERASED))

    def _ready(self, on_replica: Connect, identity: Identity, own: bool) -> bool:
        """Whether the replica holds every write of this process that the read can see."""
        tenant_id = identity.tenant_id
        if self._pending.held(tenant_id):
            return False
        every_user = not own or identity.user_id is None
        waiting = self._pending.scopes(tenant_id, identity.user_id, every_user=every_user)
        position = self._pending.position(tenant_id)
        if not waiting and position is None:
            return True
        checked = waiting[:MAX_CHECKED_SCOPES]
        with on_replica() as conn:
            rows: dict[int, int] = {}
            if checked:
                query = select(_scopes.c.id, _scopes.c.revision).where(
                    _scopes.c.tenant_id == tenant_id, _scopes.c.id.in_([state[0] for _, state in checked])
                )
                rows = {int(row.id): int(row.revision) for row in conn.execute(query)}
            replayed = None if position is None else int(conn.execute(_REPLAYED).scalar_one())
        done = all([self._pending.settle(key, rows) for key, _ in checked]) and len(checked) == len(waiting)
        if replayed is not None:
            self._pending.replayed(tenant_id, replayed)
            done = done and position is not None and replayed >= position
        return done

    def scope_ids(self, identity: Identity) -> list[tuple[str | None, int]]:
        """The identity's user's scopes on the primary, ``(agent_name, row id)`` (before an erase)."""
        if self._health is None or identity.user_id is None:
            return []
        query = select(_scopes.c.agent_name, _scopes.c.id).where(
            _scopes.c.tenant_id == identity.tenant_id,
            func.coalesce(_scopes.c.user_id, _EMPTY) == identity.user_id,
        )
        with self.primary(identity) as conn:
            return [(row.agent_name, int(row.id)) for row in conn.execute(query)]
