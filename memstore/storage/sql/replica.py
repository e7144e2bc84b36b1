"""Read replicas (``database_read_url``): which database serves a read of the SQL provider.

The provider's cold loads, searches and queries run on the replica, a PostgreSQL hot standby of
``database_url``; writes, the revision checks that guard them (a save's locked scope row), the
explicit fresh read (``reload``) and the retention signals a save ranks with stay on the primary.

**Reading your own writes.** A replica replays the primary's changes a little later, so a read
right after a save could show the scope as it was. Each ``ReadRouter`` (one per storage, shared by
its ``for_identity`` handles) remembers the ``(scope row, revision)`` this process saved each scope
at, and the rows an erase removed, until the replica is seen to hold them, for at most
``MAX_PENDING_SCOPES`` scopes (the oldest forgotten first):

- a load of such a scope that the replica answers with an older row or revision is answered again by
  the primary, as is one older than what this process last read of the scope (``holds``);
- a search or query for a user with such a scope first asks the replica for that user's scope
  revisions (one indexed statement) and runs on the primary unless every one has caught up.

A read across users (no user in its filter) shows the replica's view, as does any read in another
process: both may be as old as the replica's lag.

**The replica down.** A read the replica cannot serve (connection refused, lost or timed out, a
statement timeout or a recovery conflict) is answered by the primary, never raised while the
primary is up. The first failure is logged once per outage; the replica is then skipped and tried
again after a back-off (1 s, doubling to 30 s), and its return is logged. Its connections time out
after ``REPLICA_CONNECT_TIMEOUT_SECONDS`` unless the URL sets ``connect_timeout``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

from prometheus_client import Counter
from sqlalchemy import Connection, Engine, func, literal_column, select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from memstore.metrics import REGISTRY
from memstore.scope import Identity
from memstore.storage.sql.engine import describe_db_error, engine_for, get_engine, is_outage, mask_url
from memstore.storage.sql.identity import reading
from memstore.storage.sql.schema.models import scopes_table as _scopes

REPLICA_CONNECT_TIMEOUT_SECONDS = 2
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0
MAX_PENDING_SCOPES = 10_000
"""Scopes whose saved revision a router remembers until the replica shows it (about 1 MB)."""

READS = Counter(
    "memstore_replica_reads",
    "Reads of the SQL provider with database_read_url, by what served them: replica, primary (the "
    "replica was behind this process's own writes), fallback (the replica was unreachable)",
    ["served_by"],
    registry=REGISTRY,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
Connect = Callable[[], AbstractContextManager[Connection]]
ScopeKey = tuple[str, str | None, str | None]
"""``(tenant_id, user_id, agent_name)``, as the provider's cache keys a scope."""
State = tuple[int, int]
"""A scope's ``(row id, revision)``: a row id is never reused on PostgreSQL, so a re-created scope
compares newer than the one erased before it."""

_EMPTY: Any = literal_column("''")
ERASED = -1
"""The revision a router waits for after an erase: the replica no longer holding the scope's row."""


class ReplicaFailed(Exception):
    """The replica could not serve this read (internal: the router answers it from the primary)."""


class _Health:
    """One replica's reachability in this process: when to try it again, and whether it is down."""

    def __init__(self, shown: str) -> None:
        self.shown = shown
        self._lock = threading.Lock()
        self._failures = 0
        self._retry_at = 0.0

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

    def served(self) -> None:
        with self._lock:
            was_down, self._failures = self._failures > 0, 0
        if was_down:
            logger.info("read replica %s serves reads again", self.shown)


_health: dict[tuple[int, str], _Health] = {}
_health_lock = threading.Lock()


def replica_url(url: str) -> URL:
    """``url`` with a short ``connect_timeout`` unless it sets one: a read waiting on a replica that
    stopped answering waits that long before the primary answers it instead."""
    parsed = make_url(url)
    if "connect_timeout" in parsed.query:
        return parsed
    return parsed.update_query_dict({"connect_timeout": str(REPLICA_CONNECT_TIMEOUT_SECONDS)})


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


class ReadRouter:
    """The primary's engine and, with ``read_url``, the replica's; ``run`` sends a read to one."""

    def __init__(self, engine: Engine, read_url: str | None = None) -> None:
        self.engine = engine
        self.reader = _autocommit(engine)
        self._replica: Engine | None = None
        self._replica_reader: Engine | None = None
        self._health: _Health | None = None
        if read_url is not None:
            url = replica_url(read_url)
            self._replica = get_engine(url)
            self._replica_reader = _autocommit(self._replica)
            self._health = _health_of(url)
        self._pending: OrderedDict[ScopeKey, State] = OrderedDict()
        self._lock = threading.Lock()

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
        if not self._health.usable():
            raise ReplicaFailed
        engine = engine_for(self._replica)
        try:
            with reading(engine, engine if stream else engine_for(self._replica_reader), identity) as conn:
                yield conn
        except SQLAlchemyError as exc:
            if not is_outage(exc):
                raise
            self._health.failed(describe_db_error(exc))
            raise ReplicaFailed from exc

    def run(
        self,
        identity: Identity,
        read: Callable[[Connect], T],
        *,
        fresh: Callable[[T], bool] | None = None,
        stream: bool = False,
    ) -> T:
        """``read`` on the replica when it can serve it, else on the primary.

        ``fresh(result)`` says whether the replica's answer is recent enough (a load's revision);
        without it, a read for a user (``identity.user_id``) waits for that user's own writes.
        """

        def on_primary() -> AbstractContextManager[Connection]:
            return self.primary(identity, stream=stream)

        if self._health is None:
            return read(on_primary)

        def on_replica() -> AbstractContextManager[Connection]:
            return self._on_replica(identity, stream)

        try:
            if fresh is None and not self._caught_up(on_replica, identity):
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
        self._wait(key, (scope_id, revision))

    def erased(self, tenant_id: str, user_id: str, scopes: Iterable[tuple[str | None, int]]) -> None:
        """This process erased the user's scopes (``(agent_name, row id)``): its reads of them wait
        for the replica to have dropped those rows."""
        for agent_name, scope_id in scopes:
            self._wait((tenant_id, user_id, agent_name), (scope_id, ERASED))

    def _wait(self, key: ScopeKey, state: State) -> None:
        if self._health is None:
            return
        with self._lock:
            waiting = self._pending.pop(key, None)
            if waiting is not None and waiting[0] == state[0] and ERASED not in (state[1], waiting[1]):
                state = (state[0], max(state[1], waiting[1]))
            self._pending[key] = state
            while len(self._pending) > MAX_PENDING_SCOPES:
                self._pending.popitem(last=False)

    def holds(self, key: ScopeKey, seen: State | None, known: State | None = None) -> bool:
        """Whether a replica's answer, the scope's ``(row id, revision)`` or None when it has no such
        scope, includes this process's writes of it (once it does they are forgotten: a replica
        never goes back) and is no older than ``known``, the state this process last read."""
        if seen is not None and known is not None and seen < known:
            return False
        with self._lock:
            waiting = self._pending.get(key)
            if waiting is None:
                return True
            scope_id, revision = waiting
            if revision == ERASED:
                done = seen is None or seen[0] != scope_id
            else:
                done = seen is not None and seen[0] == scope_id and seen[1] >= revision
            if done:
                del self._pending[key]
            return done

    def _caught_up(self, on_replica: Connect, identity: Identity) -> bool:
        """Whether the replica holds every write of this process to the identity's user's scopes."""
        if identity.user_id is None:
            return True
        with self._lock:
            waiting = [
                key for key in self._pending if key[0] == identity.tenant_id and key[1] == identity.user_id
            ]
        if not waiting:
            return True
        query = select(_scopes.c.agent_name, _scopes.c.id, _scopes.c.revision).where(
            _scopes.c.tenant_id == identity.tenant_id,
            func.coalesce(_scopes.c.user_id, _EMPTY) == identity.user_id,
        )
        with on_replica() as conn:
            rows = {row.agent_name: (int(row.id), int(row.revision)) for row in conn.execute(query)}
        return all([self.holds(key, rows.get(key[2])) for key in waiting])

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
