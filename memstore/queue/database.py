"""The durable update queue: conversations wait in the database, workers in any process run them.

The request path writes one upsert (``queue_table.enqueue``) with a bounded wait: a dedicated
engine whose connect, lock and statement timeouts are ``queue_enqueue_timeout_seconds``. When
that write fails, the turn goes to ``OutageBuffer`` (bounded like the memory queue) and every
later turn follows it there until a background thread has written the buffer out, so a dead
database costs the request path nothing. That buffer is the only thing a crash can lose, and
only while the database is unreachable.

``queue_workers`` threads claim scopes and run them (``workers.py``); ``flush`` runs this
process's conversations in the caller's thread, as the memory queue's does. Claims, heartbeats,
settling and this process's bookkeeping cross tenants, so they use the operator connection
(``operator_database_url``); each conversation is saved under its own row's identity. ``shutdown`` stops
claiming, waits for the running conversations until its deadline, then gives back every claim
still held: whatever it did not finish stays queued for the next worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from memstore.async_face import bounded_here, running_loop
from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig, get_memory_config
from memstore.errors import MemstoreError, StorageUnavailableError
from memstore.metrics import count_rejection
from memstore.queue.contract import QueueStats, UpdateQueue
from memstore.queue.enqueue import (
    BoundedCalls,
    QueueWriter,
    WriteOutcome,
    enqueue_engine,
    queued_conversation,
)
from memstore.queue.outage_buffer import OutageBuffer
from memstore.queue.workers import (
    ClaimRunner,
    LeasedUpdater,
    LeasedUpdaterFactory,
    LeaseKeeper,
    utcnow,
    write_transaction_options,
)
from memstore.storage.sql.engine import describe_db_error, engine_for, get_engine, mask_url
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.table import QueuedConversation, ScopeClaim
from memstore.storage.sql.schema.migrate import prepare_once
from memstore.update.updater import MemoryUpdater, describe_failure

logger = logging.getLogger(__name__)

FLUSH_WAIT_SECONDS = 0.05
"""How often ``flush`` looks again at conversations another worker is running."""
BUFFER_RETRY_MAX_SECONDS = 30.0


def _default_updater() -> LeasedUpdater:
    updater = MemoryUpdater()
    updater.prepare()  # before the first claim, never while a claim waits on openai's imports
    return updater


class DatabaseUpdateQueue(UpdateQueue):
    """The process's handle on the shared queue; see the module docstring."""

    def __init__(
        self,
        database_url: str,
        updater_factory: LeasedUpdaterFactory | None = None,
        *,
        workers: int | None = None,
        owner: str | None = None,
        operator_url: str | None = None,
    ) -> None:
        """``owner`` takes over the rows an earlier queue of this process queued (the process-wide
        queue rebuilt for the same database); by default the queue is a new owner. ``operator_url``
        (``operator_database_url``, a role that bypasses row-level security) claims and settles
        rows of every tenant; by default ``database_url`` does."""
        config = get_memory_config()
        self._url = database_url
        self._engine = get_engine(database_url)
        self._operator = get_engine(operator_url) if operator_url else self._engine
        self._enqueue_engine = enqueue_engine(database_url, config.queue_enqueue_timeout_seconds)
        self._updater_factory = updater_factory or _default_updater
        self.owner = owner or f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(QueueStats.__dataclass_fields__, 0)
        self._stopping = threading.Event()
        self._wake = threading.Condition()
        self._keeper = LeaseKeeper(self._operator)
        self._runner = ClaimRunner(self._operator, self._keeper, self._count, self._stopping)
        self._buffer = OutageBuffer()
        self._writer = QueueWriter(self.owner, self.url, self._prepare, self._count)
        self._enqueuer = BoundedCalls(
            "memstore-enqueue", stuck_after=lambda: get_memory_config().queue_enqueue_timeout_seconds
        )
        self._buffer_thread: threading.Thread | None = None
        self._closed = False
        self._flush_updater: LeasedUpdater | None = None
        count = config.queue_workers if workers is None else workers
        self._threads = [
            threading.Thread(
                target=self._work, args=(config,), name=f"memstore-queue-worker-{index}", daemon=True
            )
            for index in range(count)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def url(self) -> str:
        return mask_url(self._url)

    # -- the queue API, as the memory queue's -------------------------------------------------

    def submit(self, context: ConversationContext, *, immediately: bool = False) -> None:
        """Write ``context`` to the queue (or, while the database is unreachable, to the buffer)."""
        config = get_memory_config()
        if not config.enabled:
            return
        if self._closed:
            logger.warning("memory queue is shut down; dropped a conversation (agent %s)", context.agent_name)
            return
        item = queued_conversation(context)
        if not self._buffer.empty():
            self._to_buffer(item, immediately, config)
            return
        outcome = self._write_now(item, immediately, config)
        if outcome is None or outcome.refused:
            return  # buffered, or this turn's own failure (logged and counted: never buffered)
        if not outcome.written:
            self._to_buffer(item, immediately, config)
            return
        self._count("accepted")
        if immediately:
            self._notify()

    def _write_now(
        self, item: QueuedConversation, immediately: bool, config: MemoryConfig
    ) -> WriteOutcome | None:
        """The row written within ``queue_enqueue_timeout_seconds``, on the request path's pool or,
        on the async face, on the event loop (a late write is cancelled there, its transaction
        rolled back); ``None`` when the turn went to the buffer instead."""
        timeout = config.queue_enqueue_timeout_seconds
        batch = [(item, immediately)]
        if running_loop() is not None:
            try:
                return bounded_here(timeout, self._writer.write, batch, config, self._enqueue_engine)
            except TimeoutError:
                self._unanswered(item, immediately, config)
                return None
        write = self._enqueuer.run(self._writer.write, batch, config, self._enqueue_engine)
        if write is None:  # every request-path writer is stuck on the (hung) database
            self._to_buffer(item, immediately, config)
            return None
        try:
            return write.result(timeout=timeout)
        except FutureTimeout:
            write.cancel()  # if it has not started, it never will
            self._unanswered(item, immediately, config)
            write.add_done_callback(lambda late: self._forget_if_written(late, item))
            return None

    def _unanswered(self, item: QueuedConversation, immediately: bool, config: MemoryConfig) -> None:
        # A hung server (not a refused connection) enforces no timeout of its own.
        logger.warning(
            "memory queue: %s did not answer within %.1f s; buffering in this process",
            self.url,
            config.queue_enqueue_timeout_seconds,
        )
        self._to_buffer(item, immediately, config)

    def flush(self) -> None:
        """Run every conversation this process queued, in the caller's thread, before returning.

        Conversations another worker is running are waited for; a conversation that fails is
        tried once per flush and stays queued for its retry. An unreachable database, or any
        other failure, ends the flush early (logged, never raised): the conversations stay queued.
        """
        try:
            self._flush(get_memory_config())
        except Exception as exc:  # a bug, a row nothing foresaw: the caller's request goes on
            self._runner.failures.report("flush", exc, "its conversations stay queued")

    def _flush(self, config: MemoryConfig) -> None:
        self._write_buffer(config)
        if self._flush_updater is None:
            self._flush_updater = self._updater_factory()
        tried: list[int] = []
        waiting = False
        while True:
            try:
                claim = self._claim(config, force=True, only_owner=self.owner, exclude=tried, idle=waiting)
                waiting = claim is None
                if claim is None:
                    with self._operator.connect() as conn:
                        if not queue_table.unsettled(conn, owner=self.owner, exclude=tried):
                            return
                    # Another worker runs one of ours: wait for it with reads, not write transactions.
                    time.sleep(FLUSH_WAIT_SECONDS)
                    continue
            except (SQLAlchemyError, MemstoreError) as exc:
                logger.warning("memory queue flush stopped: the database is unreachable: %s", exc)
                return
            tried.extend(leased.lease.row_id for leased in claim.conversations)
            self._runner.run(claim, self._flush_updater)

    def clear(self) -> None:
        """Drop this process's queued turns that no worker has claimed: its pending rows (the
        conversations whose latest turn it queued) and its outage buffer. Rows a worker holds
        run to the end, and other processes' rows stay, as the memory queue's ``clear`` leaves
        another process alone. An unreachable database raises ``StorageUnavailableError``."""
        self._buffer.clear()
        try:
            with self._operator.connect() as conn:
                conn.execution_options(**write_transaction_options(get_memory_config()))
                with conn.begin():
                    dropped = queue_table.clear_pending(conn, owner=self.owner)
        except SQLAlchemyError as exc:
            raise StorageUnavailableError(
                f"cannot clear the queue at {self.url}: {describe_db_error(exc)}"
            ) from exc
        logger.info("memory queue cleared: %d queued conversation(s) of this process dropped", dropped)

    def flush_nowait(self) -> None:
        """Make this process's queued conversations due now; the workers pick them up."""
        try:
            with self._operator.connect() as conn:
                conn.execution_options(**write_transaction_options(get_memory_config()))
                with conn.begin():
                    queue_table.make_due(conn, owner=self.owner, now=utcnow())
        except SQLAlchemyError as exc:
            logger.warning("memory queue flush_nowait: the database is unreachable: %s", exc)
            return
        self._notify()

    @property
    def pending_count(self) -> int:
        """Conversations this process queued that wait or run (in the database or the buffer).

        ``memstore queue status`` counts every process's.
        """
        try:
            with self._operator.connect() as conn:
                stored = queue_table.unsettled(conn, owner=self.owner)
        except SQLAlchemyError as exc:
            raise StorageUnavailableError(
                f"cannot count the queued conversations at {self.url}: {exc}"
            ) from exc
        return stored + len(self._buffer)

    @property
    def is_processing(self) -> bool:
        return bool(self._keeper.held())

    @property
    def stats(self) -> QueueStats:
        with self._lock:
            return QueueStats(**self._counts)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until ``pending_count`` is 0 (the workers of any process ran them); ``False`` on timeout."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while self.pending_count:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(FLUSH_WAIT_SECONDS)
        return True

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop claiming, let running conversations finish until ``timeout``, release the rest.

        Returns ``False`` only when turns were lost: the outage buffer could not be written.
        Everything else not finished stays queued in the database. Safe to call twice.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        self._closed = True
        self._stopping.set()
        self._notify()
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        config = get_memory_config()
        # The last writes get their own bound: a hung server must not hold the process's exit.
        wrap_up = threading.Thread(
            target=self._wrap_up, args=(config,), name="memstore-queue-close", daemon=True
        )
        wrap_up.start()
        remaining = None if deadline is None else deadline - time.monotonic()
        wrap_up.join(None if remaining is None else max(remaining, config.queue_enqueue_timeout_seconds))
        if wrap_up.is_alive():
            logger.error("memory queue shutdown: the database did not answer; leases expire on their own")
        self._keeper.stop()
        lost = len(self._buffer)
        if lost:
            logger.error(
                "memory queue shutdown: the database is unreachable; %d buffered conversation(s) lost", lost
            )
        return lost == 0

    def _wrap_up(self, config: MemoryConfig) -> None:
        """Give back the claims still held, then write what the buffer holds."""
        released = sum(self._runner.release(token) for token in self._keeper.held())
        if released:
            logger.info(
                "memory queue shutdown: %d running conversation(s) released for another worker", released
            )
        self._write_buffer(config)

    def close(self) -> None:
        """Stop at once (tests, a config change): claims are released, the rows stay queued."""
        self.shutdown(timeout=0.0)

    # -- internals ---------------------------------------------------------------------------

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1
        count_rejection(name)

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def _prepare(self) -> None:
        """Check (or, for embedded SQLite, create) the schema once per process, as the store does."""
        try:
            prepare_once(engine_for(self._engine), auto_migrate=get_memory_config().auto_migrate)
        except DBAPIError as exc:
            raise StorageUnavailableError(f"cannot reach the queue at {self.url}: {exc.orig}") from exc

    def _claim(
        self,
        config: MemoryConfig,
        *,
        force: bool = False,
        only_owner: str | None = None,
        exclude: Sequence[int] = (),
        idle: bool = False,
    ) -> ScopeClaim | None:
        self._prepare()
        return self._runner.claim(
            config, self.owner, force=force, only_owner=only_owner, exclude=exclude, idle=idle
        )

    def _work(self, config: MemoryConfig) -> None:
        """Claim and run until shutdown, which alone ends a worker: an outage, or an unexpected
        exception (a bug, a row nothing foresaw), is logged and backed off, and the loop goes on."""
        updater: LeasedUpdater | None = None
        failures = 0
        idle = True
        while not self._stopping.is_set():
            try:
                config = get_memory_config()
                if updater is None:
                    try:
                        updater = self._updater_factory()
                    except Exception as exc:  # a configuration that cannot extract: claim nothing
                        logger.error(
                            "memory queue worker cannot build its updater; it claims nothing for %.0f s: %s",
                            BUFFER_RETRY_MAX_SECONDS,
                            describe_failure(exc),
                        )
                        self._stopping.wait(BUFFER_RETRY_MAX_SECONDS)
                        continue
                self._runner.pause.wait(self._stopping)  # the endpoint asked for time (Retry-After)
                claim = self._claim(config, idle=idle)
                failures = 0
                if claim is None:
                    with self._wake:
                        # Woken (a turn queued now in this process): claim without looking first.
                        idle = self._stopping.is_set() or not self._wake.wait(config.queue_poll_seconds)
                    continue
                idle = False  # a backlog: the next claim needs no look first either
                self._runner.run(claim, updater)
            except Exception as exc:
                failures += 1
                pause = min(BUFFER_RETRY_MAX_SECONDS, config.queue_poll_seconds * 2 ** min(failures, 10))
                if isinstance(exc, SQLAlchemyError | MemstoreError):
                    logger.warning(
                        "memory queue worker cannot reach the database; next try in %.1f s: %s",
                        pause,
                        describe_failure(exc),
                    )
                else:
                    self._runner.failures.report("worker", exc, f"next try in {pause:.1f} s")
                self._stopping.wait(pause)

    def _to_buffer(self, item: QueuedConversation, immediately: bool, config: MemoryConfig) -> None:
        refusal = self._buffer.put(item, immediately, config)
        if refusal is not None:
            self._count("rejected_full")
            logger.warning(
                "memory queue outage buffer is full (%s); dropping a conversation (agent %s)",
                refusal,
                item.agent_name,
            )
            return
        self._count("accepted")
        with self._lock:
            if self._buffer_thread is None or not self._buffer_thread.is_alive():
                self._buffer_thread = threading.Thread(
                    target=self._drain_buffer, args=(config,), name="memstore-queue-buffer", daemon=True
                )
                self._buffer_thread.start()

    def _forget_if_written(self, late: Future[WriteOutcome], item: QueuedConversation) -> None:
        """A write that outlived its wait did land after all: the buffer need not write it again."""
        if not late.cancelled() and late.exception() is None and late.result().settled:
            self._buffer.forget(item)

    def _write_buffer(self, config: MemoryConfig) -> bool:
        """Write the buffered turns in one transaction; ``True`` once the buffer is empty. Never
        raises: what it could not write stays buffered (the drain thread tries again)."""
        items = self._buffer.snapshot()
        if not items:
            return True
        try:
            outcome = self._writer.write(items, config, self._engine)
        except Exception as exc:  # a bug: the threads that write the buffer go on
            self._runner.failures.report("outage buffer", exc, "its turns stay buffered")
            return False
        self._buffer.remove(outcome.written + outcome.refused)
        if outcome.written:
            logger.info(
                "memory queue: %d buffered conversation(s) written to the database", len(outcome.written)
            )
            self._notify()
        return self._buffer.empty()

    def _drain_buffer(self, config: MemoryConfig) -> None:
        failures = 0
        while not self._stopping.is_set() and not self._write_buffer(config):
            failures += 1
            self._stopping.wait(
                min(BUFFER_RETRY_MAX_SECONDS, config.queue_poll_seconds * 2 ** min(failures - 1, 10))
            )
            with contextlib.suppress(Exception):  # a configuration that cannot load: the last one
                config = get_memory_config()
