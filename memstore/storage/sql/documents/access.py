"""Access tracking: which facts were injected into a prompt or returned by a search, and how often.

The request path only counts in memory (``AccessRecorder.record``: a dict update under a lock).
The counts reach ``memory_facts.access_count`` and ``last_accessed_at`` in batches: one
transaction with one ``UPDATE`` parameter set per fact, written by a daemon thread once
``access_interval_seconds`` have passed since the previous flush (started by the first record,
gone again when nothing is pending), by the provider's ``close()``, at interpreter exit, and by
an explicit ``flush_access()``. Automatic flushes are at least an interval apart and write each
fact once, so tracking adds at most one write per fact per interval however often it is read.

Access records are not content: a flush never touches ``memory_scopes.revision``, the audit
history or the provider's document cache, so it invalidates nothing and audits nothing.

Counts are a best-effort signal (they feed ``memstore.retention``'s heat):
- a crash (or ``kill -9``) loses what was counted since the last flush: at most one interval;
- a flush that fails (database down, or a lock held longer than ``FLUSH_LOCK_TIMEOUT`` on
  PostgreSQL, where the flush gives way rather than risk a deadlock with a save) logs one
  WARNING and keeps the counts for the next flush;
- at most ``MAX_PENDING`` facts are held between flushes; past that, new facts are dropped
  with one WARNING until a flush makes room (already-held facts keep counting);
- a fact deleted before the flush is not updated (tombstones are skipped);
- an id that cannot be a stored fact id (not a printable string of at most 64 characters) is
  not counted, so a host's bad id can never poison a batch; a batch the database refuses for a
  reason other than an outage is dropped with one WARNING rather than retried forever.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import groupby
from time import monotonic
from typing import Any

from sqlalchemy import Connection, Engine, Integer, bindparam, case, or_, select, update
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError

from memstore.document import as_utc
from memstore.retention import FactSignals
from memstore.scope import Identity, Scope
from memstore.storage.sql.documents.statements import SCOPE_ID, WRITE_TIMEOUTS, scope_keys
from memstore.storage.sql.identity import set_identity
from memstore.storage.sql.schema.models import facts_table as _facts

logger = logging.getLogger(__name__)

MAX_PENDING = 100_000
"""Facts with counts awaiting a flush, per provider; about 20 MB at the cap."""
FLUSH_LOCK_TIMEOUT = "500ms"
"""PostgreSQL ``lock_timeout`` of a flush: under the server's default ``deadlock_timeout`` (1 s), so a
flush that meets a save on the same facts fails (and retries next interval) before the save could."""
FLUSH_STATEMENT_TIMEOUT = "10s"
MAX_FACT_ID_CHARS = 64
"""``memory_facts.fact_id`` is VARCHAR(64): a longer id cannot name a stored fact."""

_accessed_at = bindparam("b_at", type_=_facts.c.last_accessed_at.type)
RECORD_ACCESS = (
    update(_facts)
    .where(
        _facts.c.scope_id == SCOPE_ID,
        _facts.c.fact_id == bindparam("b_fact_id"),
        _facts.c.deleted_revision.is_(None),
    )
    .values(
        access_count=_facts.c.access_count + bindparam("b_count", type_=Integer()),
        # Another process may have flushed a later access already: keep the latest.
        last_accessed_at=case(
            (
                or_(_facts.c.last_accessed_at.is_(None), _facts.c.last_accessed_at < _accessed_at),
                _accessed_at,
            ),
            else_=_facts.c.last_accessed_at,
        ),
    )
)
SIGNALS_QUERY = select(
    _facts.c.fact_id, _facts.c.last_confirmed_at, _facts.c.last_accessed_at, _facts.c.access_count
).where(_facts.c.scope_id == SCOPE_ID, _facts.c.deleted_revision.is_(None))

_Key = tuple[str, str, str, str]
"""``(tenant_key, user_key, agent_key, fact_id)``, the scope as ``scope_keys`` binds it."""


@dataclass(slots=True)
class _Pending:
    count: int
    at: datetime


class AccessRecorder:
    """Counts fact accesses in memory and writes them in batches (see the module docstring)."""

    def __init__(
        self,
        engine: Engine,
        *,
        interval: float,
        write_options: Mapping[str, Any],
        describe: Callable[[Exception], str] = str,
    ) -> None:
        """``describe`` renders a database error for the log (the provider's scrubs passwords)."""
        self._engine = engine
        self._describe = describe
        self._interval = interval
        self._write_options = dict(write_options)
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one flush at a time: the thread's or an explicit one
        self._pending: dict[_Key, _Pending] = {}
        self._flushed_at = monotonic()
        self._stop: threading.Event | None = None  # set while a flusher thread runs
        self._failing = False
        self._dropping = False
        _recorders.add(self)

    def record(self, tenant_id: str, scope: Scope, fact_ids: Iterable[str]) -> None:
        """Count one access of each fact of ``scope``; memory only, safe to call on every request."""
        user_key, agent_key = scope[0] or "", scope[1] or ""
        now = datetime.now(UTC)
        dropped = False
        with self._lock:
            pending = self._pending
            for fact_id in fact_ids:
                if not _storable(fact_id):
                    continue
                entry = pending.get((tenant_id, user_key, agent_key, fact_id))
                if entry is not None:
                    entry.count += 1
                    entry.at = now
                elif len(pending) < MAX_PENDING:
                    pending[(tenant_id, user_key, agent_key, fact_id)] = _Pending(1, now)
                else:
                    dropped = True
            if pending and self._stop is None:
                self._start_flusher()
            warn, self._dropping = dropped and not self._dropping, self._dropping or dropped
        if warn:
            logger.warning(
                "access tracking holds %d facts awaiting a flush; further accesses are not counted "
                "until one succeeds",
                MAX_PENDING,
            )

    def flush(self, *, due_only: bool = False) -> int:
        """Write the pending counts in one transaction; returns how many facts it wrote.

        ``due_only`` writes only when an interval has passed since the previous flush (what the
        flusher thread does). A failure keeps the counts, logs (one WARNING until a flush
        succeeds again) and returns 0.
        """
        with self._flush_lock:
            with self._lock:
                if due_only and monotonic() - self._flushed_at < self._interval:
                    return 0
                batch, self._pending = self._pending, {}
                self._flushed_at = monotonic()
                self._dropping = False
            if not batch:
                return 0
            try:
                with self._engine.connect() as conn:
                    self._write(conn, batch)
            except (OperationalError, InterfaceError) as exc:
                self._keep(batch)
                log = logger.debug if self._failing else logger.warning
                log("could not record fact accesses (kept for the next flush): %s", self._describe(exc))
                self._failing = True
                return 0
            except SQLAlchemyError as exc:
                logger.warning(
                    "the database refused %d fact access counts, which are dropped: %s",
                    len(batch),
                    self._describe(exc),
                )
                return 0
            if self._failing:
                logger.info("fact accesses recorded again")
                self._failing = False
            return len(batch)

    def close(self) -> None:
        """Stop the flusher thread and write what is pending (a later ``record`` starts a new one)."""
        with self._lock:
            stop, self._stop = self._stop, None
        if stop is not None:
            stop.set()
        self.flush()

    def _write(self, conn: Connection, batch: dict[_Key, _Pending]) -> None:
        # Sorted, so concurrent flushers in other processes take row locks in the same order.
        rows = [
            {
                "tenant_key": key[0],
                "user_key": key[1],
                "agent_key": key[2],
                "b_fact_id": key[3],
                "b_count": e.count,
                "b_at": e.at,
            }
            for key, e in sorted(batch.items(), key=lambda item: item[0])
        ]
        conn.execution_options(**self._write_options)
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(
                    WRITE_TIMEOUTS,
                    {"lock_timeout": FLUSH_LOCK_TIMEOUT, "statement_timeout": FLUSH_STATEMENT_TIMEOUT},
                )
            # One statement per (tenant, user): each runs under that identity, which is what
            # PostgreSQL's row-level security lets write the user's facts.
            for (tenant_id, user_key), group in groupby(
                rows, key=lambda row: (row["tenant_key"], row["user_key"])
            ):
                set_identity(conn, Identity(tenant_id, user_key or None))
                conn.execute(RECORD_ACCESS, list(group))

    def _keep(self, batch: dict[_Key, _Pending]) -> None:
        """Put a failed batch back, merged with what was counted meanwhile, within the cap."""
        with self._lock:
            pending = self._pending
            for key, entry in batch.items():
                current = pending.get(key)
                if current is not None:
                    current.count += entry.count
                    current.at = max(current.at, entry.at)
                elif len(pending) < MAX_PENDING:
                    pending[key] = entry
            if pending and self._stop is None:
                self._start_flusher()

    def _start_flusher(self) -> None:
        """Called under ``_lock``: one daemon thread per recorder, only while counts are pending."""
        stop = threading.Event()
        self._stop = stop
        threading.Thread(target=self._run, args=(stop,), name="memstore-access", daemon=True).start()

    def _run(self, stop: threading.Event) -> None:
        try:
            while True:
                with self._lock:
                    wait = self._flushed_at + self._interval - monotonic()
                if stop.wait(max(wait, 0.0)):
                    return
                self.flush(due_only=True)
                with self._lock:
                    if self._stop is not stop or not self._pending:
                        return
        except Exception:
            logger.exception("the access flusher failed; the next access starts a new one")
        finally:
            with self._lock:
                if self._stop is stop:
                    self._stop = None


def _storable(fact_id: object) -> bool:
    """Whether ``fact_id`` could name a stored fact (and so be bound into the UPDATE safely)."""
    return isinstance(fact_id, str) and 0 < len(fact_id) <= MAX_FACT_ID_CHARS and fact_id.isprintable()


def fact_signals(conn: Connection, tenant_id: str, scope: Scope) -> dict[str, FactSignals]:
    """The retention signals of the scope's live facts, by fact id (flushed counts only)."""
    rows = conn.execute(SIGNALS_QUERY, scope_keys(scope, tenant_id)).all()
    return {
        row.fact_id: FactSignals(
            last_confirmed_at=as_utc(row.last_confirmed_at),
            last_accessed_at=as_utc(row.last_accessed_at),
            access_count=int(row.access_count),
        )
        for row in rows
    }


_recorders: weakref.WeakSet[AccessRecorder] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    """A clean exit writes the pending counts; only a crash loses them."""
    for recorder in list(_recorders):
        recorder.close()
