"""The durable update queue: conversations wait in the database, workers in any process run them.

The request path writes one upsert (``queue_table.enqueue``) with a bounded wait: a dedicated
engine whose connect, lock and statement timeouts are ``queue_enqueue_timeout_seconds``. When
that write fails, the turn goes to ``OutageBuffer`` (bounded like the memory queue) and every
later turn follows it there until a background thread has written the buffer out, so a dead
database costs the request path nothing. That buffer is the only thing a crash can lose, and
only while the database is unreachable.

``queue_workers`` threads claim scopes and run them (``workers.py``); ``flush`` runs this
process's conversations in the caller's thread, as the memory queue's does. ``shutdown`` stops
claiming, waits for the running conversations until its deadline, then gives back every claim
still held: whatever it did not finish stays queued for the next worker.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from memstore.capture.conversation import ConversationContext
from memstore.capture.filtering import bound_conversation
from memstore.capture.message_access import text_only
from memstore.config import MemoryConfig, get_memory_config
from memstore.errors import MemstoreError, StorageUnavailableError
from memstore.queue.contract import QueueStats
from memstore.queue.debounced import (
    MAX_DEBOUNCE_FACTOR,
    MAX_QUEUED_CONVERSATION_CHARS,
    MAX_QUEUED_MESSAGE_CHARS,
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
from memstore.storage.sql import queue_table
from memstore.storage.sql.engine import SQLITE_BUSY_TIMEOUT_OPTION, SQLITE_WRITE_OPTION, get_engine, mask_url
from memstore.storage.sql.provider import SqlMemoryStorage
from memstore.storage.sql.queue_table import QueuedConversation, ScopeClaim
from memstore.update.updater import MemoryUpdater

logger = logging.getLogger(__name__)

FLUSH_WAIT_SECONDS = 0.05
"""How often ``flush`` looks again at conversations another worker is running."""
BUFFER_RETRY_MAX_SECONDS = 30.0


def _default_updater() -> LeasedUpdater:
    return MemoryUpdater()


def enqueue_engine(url: str, timeout: float) -> Engine:
    """An engine whose every wait is bounded by ``timeout``: the request path's own pool."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return get_engine(url)
    ms = round(timeout * 1000)
    # libpq counts connect_timeout in whole seconds (and treats 1 as 2).
    query = {
        "connect_timeout": str(max(2, math.ceil(timeout))),
        "options": f"-c statement_timeout={ms} -c lock_timeout={ms}",
    }
    return get_engine(parsed.update_query_dict(query))


class DatabaseUpdateQueue:
    """The process's handle on the shared queue; see the module docstring."""

    def __init__(
        self,
        database_url: str,
        updater_factory: LeasedUpdaterFactory | None = None,
        *,
        workers: int | None = None,
    ) -> None:
        config = get_memory_config()
        self._url = database_url
        self._prepare_schema()
        self._engine = get_engine(database_url)
        self._enqueue_engine = enqueue_engine(database_url, config.queue_enqueue_timeout_seconds)
        self._updater_factory = updater_factory or _default_updater
        self.owner = f"{socket.gethostname()[:64]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        self._counts: dict[str, int] = dict.fromkeys(QueueStats.__dataclass_fields__, 0)
        self._stopping = threading.Event()
        self._wake = threading.Condition()
        self._keeper = LeaseKeeper(self._engine)
        self._runner = ClaimRunner(self._engine, self._keeper, self._count, self._stopping)
        self._buffer = OutageBuffer()
        self._buffer_thread: threading.Thread | None = None
        self._closed = False
        self._flush_updater: LeasedUpdater | None = None
        count = config.queue_workers if workers is None else workers
        self._threads = [
            threading.Thread(target=self._work, name=f"memstore-queue-worker-{index}", daemon=True)
            for index in range(count)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def url(self) -> str:
        return mask_url(self._url)

    # -- the queue API, as the memory queue's -------------------------------------------------

    def add(
        self,
        thread_id: str,
        messages: list[Any],
        agent_name: str | None = None,
        user_id: str | None = None,
        correction_detected: bool = False,
        reinforcement_detected: bool = False,
    ) -> None:
        """The reference's call: queue a conversation, due after the debounce."""
        self.submit(
            ConversationContext(
                thread_id, list(messages), agent_name, user_id, correction_detected, reinforcement_detected
            )
        )

    def add_nowait(
        self,
        thread_id: str,
        messages: list[Any],
        agent_name: str | None = None,
        user_id: str | None = None,
        correction_detected: bool = False,
        reinforcement_detected: bool = False,
    ) -> None:
        """The reference's call: queue a conversation, due now."""
        self.submit(
            ConversationContext(
                thread_id, list(messages), agent_name, user_id, correction_detected, reinforcement_detected
            ),
            immediately=True,
        )

    def submit(self, context: ConversationContext, *, immediately: bool = False) -> None:
        """Write ``context`` to the queue (or, while the database is unreachable, to the buffer)."""
        config = get_memory_config()
        if not config.enabled:
            return
        if self._closed:
            logger.warning("memory queue is shut down; dropping the update for thread %s", context.thread_id)
            return
        item = _queued(context)
        if not self._buffer.empty() or not self._write([(item, immediately)], config, self._enqueue_engine):
            self._to_buffer(item, immediately, config)
            return
        self._count("accepted")
        if immediately:
            self._notify()

    def flush(self) -> None:
        """Run every conversation this process queued, in the caller's thread, before returning.

        Conversations another worker is running are waited for; a conversation that fails is
        tried once per flush and stays queued for its retry. An unreachable database ends the
        flush early (logged): the conversations stay queued.
        """
        config = get_memory_config()
        self._write_buffer(config)
        if self._flush_updater is None:
            self._flush_updater = self._updater_factory()
        tried: list[int] = []
        while True:
            try:
                claim = self._claim(config, force=True, only_owner=self.owner, exclude=tried)
                if claim is None:
                    with self._engine.connect() as conn:
                        if not queue_table.unsettled(conn, owner=self.owner, exclude=tried):
                            return
                    time.sleep(FLUSH_WAIT_SECONDS)
                    continue
            except SQLAlchemyError as exc:
                logger.warning("memory queue flush stopped: the database is unreachable: %s", exc)
                return
            tried.extend(leased.lease.row_id for leased in claim.conversations)
            self._runner.run(claim, self._flush_updater)

    def flush_nowait(self) -> None:
        """Make this process's queued conversations due now; the workers pick them up."""
        try:
            with self._engine.connect() as conn:
                conn.execution_options(**write_transaction_options(get_memory_config()))
                with conn.begin():
                    queue_table.make_due(conn, owner=self.owner, now=utcnow())
        except SQLAlchemyError as exc:
            logger.warning("memory queue flush_nowait: the database is unreachable: %s", exc)
            return
        self._notify()

    @property
    def pending_count(self) -> int:
        """Conversations waiting or running in the shared queue (every process's), plus the buffer."""
        try:
            with self._engine.connect() as conn:
                stored = queue_table.unsettled(conn)
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
        """Wait until the shared queue holds nothing pending or running; ``False`` on timeout."""
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
        released = sum(self._runner.release(token) for token in self._keeper.held())
        if released:
            logger.info(
                "memory queue shutdown: %d running conversation(s) released for another worker", released
            )
        self._keeper.stop()
        self._write_buffer(get_memory_config())
        lost = len(self._buffer)
        if lost:
            logger.error(
                "memory queue shutdown: the database is unreachable; %d buffered conversation(s) lost", lost
            )
        return lost == 0

    def close(self) -> None:
        """Stop at once (tests, a config change): claims are released, the rows stay queued."""
        self.shutdown(timeout=0.0)

    # -- internals ---------------------------------------------------------------------------

    def _prepare_schema(self) -> None:
        """Migrate the database as the storage does (always SQLite; PostgreSQL with ``auto_migrate``).

        The queue may be the first to open a fresh embedded database (injection off, ``memstore
        worker``); without this its tables would not exist until a storage happened to be built.
        A database that is down or behind head is only logged: turns wait in the outage buffer.
        """
        try:
            SqlMemoryStorage(self._url)
        except MemstoreError as exc:
            logger.warning("memory queue: the database at %s is not ready yet: %s", self.url, exc)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def _claim(
        self,
        config: MemoryConfig,
        *,
        force: bool = False,
        only_owner: str | None = None,
        exclude: list[int] | None = None,
    ) -> ScopeClaim | None:
        now = utcnow()
        if not force:
            with self._engine.connect() as conn:
                if not queue_table.has_claimable(conn, now):
                    return None
        with self._engine.connect() as conn:
            conn.execution_options(**write_transaction_options(config))
            with conn.begin():
                return queue_table.claim(
                    conn,
                    owner=self.owner,
                    now=now,
                    lease_seconds=config.queue_lease_seconds,
                    force=force,
                    only_owner=only_owner,
                    exclude=exclude or (),
                )

    def _work(self) -> None:
        updater: LeasedUpdater | None = None
        failures = 0
        while not self._stopping.is_set():
            config = get_memory_config()
            try:
                if updater is None:
                    updater = self._updater_factory()
                claim = self._claim(config)
                failures = 0
            except SQLAlchemyError as exc:
                failures += 1
                pause = min(BUFFER_RETRY_MAX_SECONDS, config.queue_poll_seconds * 2 ** min(failures, 10))
                logger.warning(
                    "memory queue worker cannot reach the database; next try in %.1f s: %s", pause, exc
                )
                self._stopping.wait(pause)
                continue
            except Exception:
                logger.exception("memory queue worker could not create its updater; next try shortly")
                self._stopping.wait(BUFFER_RETRY_MAX_SECONDS)
                continue
            if claim is None:
                with self._wake:
                    if not self._stopping.is_set():
                        self._wake.wait(config.queue_poll_seconds)
                continue
            self._runner.run(claim, updater)

    def _write(
        self, items: list[tuple[QueuedConversation, bool]], config: MemoryConfig, engine: Engine
    ) -> bool:
        """Upsert ``items`` in one transaction; ``False`` (logged) when the database refused."""
        debounce = float(config.debounce_seconds)
        options: dict[str, Any] = {SQLITE_WRITE_OPTION: True}
        options[SQLITE_BUSY_TIMEOUT_OPTION] = round(config.queue_enqueue_timeout_seconds * 1000)
        try:
            with engine.connect() as conn:
                conn.execution_options(**options)
                with conn.begin():
                    now = utcnow()
                    for item, immediately in items:
                        queue_table.enqueue(
                            conn,
                            item,
                            owner=self.owner,
                            now=now,
                            due_at=now if immediately else now + timedelta(seconds=debounce),
                            latest_due_at=now
                            if immediately
                            else now + timedelta(seconds=MAX_DEBOUNCE_FACTOR * debounce),
                        )
        except SQLAlchemyError as exc:
            logger.warning("memory queue cannot write to %s; buffering in this process: %s", self.url, exc)
            return False
        return True

    def _to_buffer(self, item: QueuedConversation, immediately: bool, config: MemoryConfig) -> None:
        refusal = self._buffer.put(item, immediately, config)
        if refusal is not None:
            self._count("rejected_full")
            logger.warning(
                "memory queue outage buffer is full (%s); dropping the update for thread %s",
                refusal,
                item.thread_id,
            )
            return
        self._count("accepted")
        with self._lock:
            if self._buffer_thread is None or not self._buffer_thread.is_alive():
                self._buffer_thread = threading.Thread(
                    target=self._drain_buffer, name="memstore-queue-buffer", daemon=True
                )
                self._buffer_thread.start()

    def _write_buffer(self, config: MemoryConfig) -> bool:
        """Write the buffered turns in one transaction; ``True`` once the buffer is empty."""
        items = self._buffer.snapshot()
        if not items:
            return True
        if not self._write(items, config, self._engine):
            return False
        self._buffer.remove(items)
        logger.info("memory queue: %d buffered conversation(s) written to the database", len(items))
        self._notify()
        return self._buffer.empty()

    def _drain_buffer(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            config = get_memory_config()
            if self._write_buffer(config):
                return
            failures += 1
            self._stopping.wait(
                min(BUFFER_RETRY_MAX_SECONDS, config.queue_poll_seconds * 2 ** min(failures - 1, 10))
            )


def _queued(context: ConversationContext) -> QueuedConversation:
    """The conversation as a queue row keeps it: text only, trimmed to the queue's caps."""
    bounded = bound_conversation(
        context.messages,
        max_message_chars=MAX_QUEUED_MESSAGE_CHARS,
        max_total_chars=MAX_QUEUED_CONVERSATION_CHARS,
    )
    return QueuedConversation(
        thread_id=context.thread_id,
        user_id=context.user_id,
        agent_name=context.agent_name,
        messages=[text_only(message) for message in bounded],
        correction_detected=context.correction_detected,
        reinforcement_detected=context.reinforcement_detected,
        captured_at=context.timestamp,
    )
