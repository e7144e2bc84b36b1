"""The request path's side of the database queue: what a row holds, how it is written, and a wait
with a bound.

``queue_enqueue_timeout_seconds`` bounds each write twice over. The server enforces it (the
request path's own PostgreSQL engine sets ``statement_timeout``, ``lock_timeout`` and
``connect_timeout``; SQLite's busy timeout), and the caller stops waiting after it
(``BoundedCalls``), because a server that hangs instead of refusing enforces nothing.

``QueueWriter`` tells a turn's own failure (a bound it would pass, a value the database will not
store) from an outage: the first sets that turn aside, the second keeps every turn buffered.

Each row is written under its own identity (tenant and user, set per row in the transaction),
so on PostgreSQL with row-level security the policies refuse a row forged for anyone else. The
bounds count every tenant's rows: where the policies apply they are read on the operator
connection (``operator_database_url``) when one is configured.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from memstore.capture.conversation import ConversationContext
from memstore.capture.filtering import bound_conversation, storable_text
from memstore.capture.message_access import text_only
from memstore.config import MemoryConfig
from memstore.document import as_utc
from memstore.errors import MemstoreError, QueueFullError
from memstore.queue.bounds import (
    MAX_QUEUED_CONVERSATION_CHARS,
    MAX_QUEUED_MESSAGE_CHARS,
    MAX_QUEUED_MESSAGES,
    table_limits,
)
from memstore.queue.debounced import MAX_DEBOUNCE_FACTOR
from memstore.queue.outage_buffer import Buffered
from memstore.queue.workers import utcnow
from memstore.scope import Identity, resolve_scope
from memstore.storage.sql.documents.statements import WRITE_TIMEOUTS
from memstore.storage.sql.engine import describe_db_error, engine_for, get_engine, is_refused_value
from memstore.storage.sql.identity import policies_apply, set_identity
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.table import QueuedConversation

logger = logging.getLogger(__name__)

T = TypeVar("T")
REFUSAL_LOG_SECONDS = 60.0
"""A kind of refusal is logged at most once this often; the stats and metrics count every one."""
ENQUEUE_THREADS = 8
"""Threads that run request-path writes; while every one is stuck, turns go to the buffer."""


def enqueue_engine(url: str, timeout: float) -> Engine:
    """The request path's own pool, whose connecting is bounded by ``timeout`` (its server-side
    waits are bounded per transaction: ``bound_waits``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return get_engine(url)
    # libpq counts connect_timeout in whole seconds (and treats 1 as 2).
    return get_engine(parsed.update_query_dict({"connect_timeout": str(max(2, math.ceil(timeout)))}))


def bound_waits(conn: Connection, timeout: float) -> None:
    """Bound this transaction's lock and statement waits by ``timeout`` on PostgreSQL. Set in the
    transaction (``set_config(..., true)``), not for the session: a transaction pooler such as
    PgBouncer refuses or drops startup options, and lends the server connection to others after."""
    if conn.dialect.name == "postgresql":
        waits = f"{round(timeout * 1000)}ms"
        conn.execute(WRITE_TIMEOUTS, {"lock_timeout": waits, "statement_timeout": waits})


def queued_conversation(context: ConversationContext) -> QueuedConversation:
    """The conversation as a queue row keeps it: text only, trimmed to the queue's caps."""
    bounded = bound_conversation(
        context.messages,
        max_message_chars=MAX_QUEUED_MESSAGE_CHARS,
        max_total_chars=MAX_QUEUED_CONVERSATION_CHARS,
    )
    # Checked here, on the request, so a bad id is the caller's error rather than a row that
    # fails on every claim; the text is made storable, so no turn can fail a shared write.
    resolve_scope(context.agent_name, context.user_id)
    messages = [text_only(message) for message in bounded]
    # An empty message teaches nothing and costs no characters: unbounded, they would be free rows.
    messages = [message for message in messages if message["content"].strip()][-MAX_QUEUED_MESSAGES:]
    for message in messages:
        message["content"] = storable_text(message["content"])
        message["role"] = storable_text(message["role"])
    return QueuedConversation(
        thread_id=context.thread_id,
        user_id=context.user_id,
        agent_name=context.agent_name,
        messages=messages,
        correction_detected=context.correction_detected,
        reinforcement_detected=context.reinforcement_detected,
        captured_at=as_utc(context.timestamp),
        tenant_id=context.tenant_id,
        kind=context.kind,
    )


@contextmanager
def _bounds_reader(config: MemoryConfig, engine: Engine) -> Iterator[Connection | None]:
    """The connection the bounds are read on: the operator's where row-level security would hide
    other tenants' rows from ``engine`` and one is configured; else ``None`` (the write's own)."""
    if not config.operator_database_url or not policies_apply(engine):
        yield None
        return
    operator = engine_for(enqueue_engine(config.operator_database_url, config.queue_enqueue_timeout_seconds))
    with operator.connect() as conn:
        bound_waits(conn, config.queue_enqueue_timeout_seconds)  # begins the transaction its reads share
        yield conn


class BoundedCalls:
    """Runs calls on daemon threads and hands back a ``Future`` the caller waits on with a timeout.

    Daemon threads, unlike ``ThreadPoolExecutor``'s, do not hold up interpreter exit while a
    write hangs on a stopped server. Busy threads are normal under load (more are started, up to
    ``ENQUEUE_THREADS``, and jobs wait their turn); only when every thread has been inside one
    call for longer than ``stuck_after`` does ``run`` refuse, so the caller can move on at once.
    """

    def __init__(self, name: str, *, stuck_after: Callable[[], float]) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._name = name
        self._stuck_after = stuck_after
        self._started: dict[int, float | None] = {}
        """Per thread: when its current call started, or None while it waits for one."""
        self._lock = threading.Lock()

    def run(self, function: Callable[..., T], *args: Any) -> Future[T] | None:
        """The call's future, or ``None`` when every thread is stuck in a call: the caller moves on."""
        future: Future[T] = Future()
        with self._lock:
            idle = sum(1 for started in self._started.values() if started is None)
            if idle <= self._jobs.qsize():
                if len(self._started) < ENQUEUE_THREADS:
                    self._start_thread()
                elif self._all_stuck():
                    return None
            self._jobs.put((future, function, args))
        return future

    def _all_stuck(self) -> bool:
        cutoff = time.monotonic() - self._stuck_after()
        return all(started is not None and started < cutoff for started in self._started.values())

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._serve, name=f"{self._name}-{len(self._started)}", daemon=True)
        thread.start()
        self._started[thread.ident or id(thread)] = None

    def _serve(self) -> None:
        me = threading.get_ident()
        while True:
            future, function, args = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._started[me] = time.monotonic()
            try:
                future.set_result(function(*args))
            except BaseException as exc:
                future.set_exception(exc)
            finally:
                with self._lock:
                    self._started[me] = None


@dataclass
class WriteOutcome:
    """What a write of queued turns did with each: written, refused for good, or neither (an
    outage: those stay buffered)."""

    written: list[Buffered] = field(default_factory=list)
    refused: list[Buffered] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        """Nothing is left to write: every item was written or set aside."""
        return bool(self.written or self.refused)


def _refused(exc: BaseException) -> bool:
    """The write failed because of an item, not the database: a bound, or a value it refuses."""
    return isinstance(exc, QueueFullError) or (not isinstance(exc, MemstoreError) and is_refused_value(exc))


class QueueWriter:
    """Writes queued turns to the table for one queue (the request path and the outage buffer)."""

    def __init__(
        self, owner: str, url_label: str, prepare: Callable[[], None], count: Callable[[str], None]
    ) -> None:
        self._owner = owner
        self._url_label = url_label
        self._prepare = prepare
        self._count = count
        self._last_refusal: dict[str, tuple[float, int]] = {}
        """Per stat: when a refusal was last logged, and how many were not logged since."""
        self._log_lock = threading.Lock()

    def write(self, items: list[Buffered], config: MemoryConfig, engine: Engine) -> WriteOutcome:
        """Upsert ``items``: in one transaction, or, when one item is refused, one by one.

        An item the database refuses for its own sake (a value it cannot store, a bound it would
        pass) is set aside: logged with its reason, counted, never retried, and never allowed to
        hold back the others. Only an outage (or a schema behind head) leaves items unwritten.
        """
        try:
            self._prepare()
            self._upsert(items, config, engine)
            return WriteOutcome(written=items)
        except (SQLAlchemyError, MemstoreError, ValueError, TypeError) as exc:
            if not _refused(exc):
                self._log_outage(exc)
                return WriteOutcome()
            if len(items) == 1:
                return WriteOutcome(refused=[self._set_aside(items[0], exc)])
        outcome = WriteOutcome()
        for entry in items:
            try:
                self._upsert([entry], config, engine)
            except (SQLAlchemyError, MemstoreError, ValueError, TypeError) as exc:
                if not _refused(exc):
                    self._log_outage(exc)
                    return outcome  # the rest waits for the database, in order
                outcome.refused.append(self._set_aside(entry, exc))
                continue
            outcome.written.append(entry)
        return outcome

    def _upsert(self, items: list[Buffered], config: MemoryConfig, engine: Engine) -> None:
        debounce = float(config.debounce_seconds)
        options = queue_table.write_options(round(config.queue_enqueue_timeout_seconds * 1000))
        limits = table_limits(config)
        engine = engine_for(engine)
        with engine.connect() as conn, _bounds_reader(config, engine) as bounds:
            conn.execution_options(**options)
            with conn.begin():
                bound_waits(conn, config.queue_enqueue_timeout_seconds)
                now = utcnow()
                for item, immediately in items:
                    set_identity(conn, Identity(item.tenant_id, item.user_id))
                    stored = queue_table.enqueue(
                        conn,
                        item,
                        owner=self._owner,
                        now=now,
                        due_at=now if immediately else now + timedelta(seconds=debounce),
                        latest_due_at=now
                        if immediately
                        else now + timedelta(seconds=MAX_DEBOUNCE_FACTOR * debounce),
                        limits=limits,
                        bounds=bounds,
                    )
                    if not stored:
                        logger.info(
                            "memory queue: a newer turn of this conversation is queued already; this "
                            "one is not (a late write, or a replica whose clock is behind)"
                        )

    def _log_outage(self, exc: BaseException) -> None:
        logger.warning(
            "memory queue cannot write to %s; buffering in this process: %s",
            self._url_label,
            describe_db_error(exc),
        )

    def _set_aside(self, entry: Buffered, exc: BaseException) -> Buffered:
        """Count and log a turn refused for its own sake; it is dropped, the others go on.

        A flood is refused turn by turn, so the log says it once per ``REFUSAL_LOG_SECONDS`` per
        reason, with how many it did not repeat: a flood must not become a flood of log lines.
        """
        if isinstance(exc, QueueFullError):
            stat = f"rejected_{exc.kind}" if exc.kind in ("user_share", "tenant_share") else "rejected_full"
            level, reason = logging.WARNING, str(exc)
        else:
            stat = "rejected_invalid"
            level, reason = logging.ERROR, f"the database refused its content: {describe_db_error(exc)}"
        self._count(stat)
        now = time.monotonic()
        with self._log_lock:
            last, quiet = self._last_refusal.get(stat, (-REFUSAL_LOG_SECONDS, 0))
            if now - last < REFUSAL_LOG_SECONDS:
                self._last_refusal[stat] = (last, quiet + 1)
                return entry
            self._last_refusal[stat] = (now, 0)
        logger.log(
            level,
            "memory queue dropped a conversation (agent %s), the others are written: %s%s",
            entry[0].agent_name,
            reason,
            f" ({quiet} more like it since the last report)" if quiet else "",
        )
        return entry
