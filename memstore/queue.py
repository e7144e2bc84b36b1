"""The debounced update queue between the request path and the (slow) LLM updater.

Turns are batched per conversation key ``(thread_id, user_id, agent_name)``: the newest
messages for a key replace the older ones, because the middleware always sends the whole
filtered thread. One global timer covers the queue, so a burst of turns costs one batch.
At most one worker runs at a time; a trigger that arrives while it is busy only leaves a
note, and the finishing worker schedules exactly one follow-up (no 0-delay timer spin).

Beyond the reference, ``shutdown`` drains pending work so a deploy or SIGTERM loses nothing;
once it has run, new turns are dropped with a warning because the process is going away.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from memstore.config import MemoryConfig, get_memory_config

logger = logging.getLogger(__name__)

DEFAULT_BATCH_INTERVAL_SECONDS = 0.5
"""Pause between contexts of one batch, to spread LLM calls out a little."""

_QueueKey = tuple[str, str | None, str | None]


class MemoryUpdaterLike(Protocol):
    """What the queue needs from an updater: one call per conversation, never raising by contract."""

    def update_memory(
        self,
        messages: list[Any],
        *,
        thread_id: str | None,
        agent_name: str | None,
        correction_detected: bool,
        reinforcement_detected: bool,
        user_id: str | None,
        captured_at: datetime | None,
    ) -> bool: ...


UpdaterFactory = Callable[[], MemoryUpdaterLike]


@dataclass
class ConversationContext:
    """One pending conversation; ``user_id`` is captured by the producer, never on the worker."""

    thread_id: str
    messages: list[Any]
    agent_name: str | None = None
    user_id: str | None = None
    correction_detected: bool = False
    reinforcement_detected: bool = False
    timestamp: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def key(self) -> _QueueKey:
        return (self.thread_id, self.user_id, self.agent_name)


def _default_updater_factory() -> MemoryUpdaterLike:
    # Imported here so the queue (and the middleware importing it) never pays for the LLM stack
    # on the request path, and so the updater reads the config current at processing time.
    from memstore.updater import MemoryUpdater

    return MemoryUpdater()


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class MemoryUpdateQueue:
    """Thread-safe debounced queue; see the module docstring for the scheduling rules."""

    def __init__(
        self,
        updater_factory: UpdaterFactory | None = None,
        *,
        batch_interval_seconds: float = DEFAULT_BATCH_INTERVAL_SECONDS,
    ) -> None:
        self._updater_factory = updater_factory or _default_updater_factory
        self._batch_interval = batch_interval_seconds
        self._queue: list[ConversationContext] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._timer: threading.Timer | None = None
        self._processing = False
        self._rerun_pending = False
        self._closed = False
        # Set by shutdown so a worker pausing between contexts stops waiting at once.
        self._stopping = threading.Event()

    def add(
        self,
        thread_id: str,
        messages: list[Any],
        agent_name: str | None = None,
        user_id: str | None = None,
        correction_detected: bool = False,
        reinforcement_detected: bool = False,
    ) -> None:
        """Queue a conversation and restart the debounce timer for the whole queue."""
        context = ConversationContext(
            thread_id, list(messages), agent_name, user_id, correction_detected, reinforcement_detected
        )
        self._enqueue(context, delay=None)

    def add_nowait(
        self,
        thread_id: str,
        messages: list[Any],
        agent_name: str | None = None,
        user_id: str | None = None,
        correction_detected: bool = False,
        reinforcement_detected: bool = False,
    ) -> None:
        """Queue a conversation and process the whole queue now, on a background thread."""
        context = ConversationContext(
            thread_id, list(messages), agent_name, user_id, correction_detected, reinforcement_detected
        )
        self._enqueue(context, delay=0.0)

    def flush(self) -> None:
        """Process everything pending in the caller's thread.

        If a worker is already busy this returns at once; that worker picks the queue up next.
        """
        with self._lock:
            self._cancel_timer_locked()
        self._process_queue()

    def flush_nowait(self) -> None:
        """Process everything pending now, on a background thread."""
        with self._lock:
            self._schedule_timer_locked(0.0)

    def clear(self) -> None:
        """Drop pending work and the timer; an in-flight worker finishes its own batch."""
        with self._lock:
            self._cancel_timer_locked()
            self._queue.clear()
            self._rerun_pending = False

    @property
    def pending_count(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def is_processing(self) -> bool:
        with self._lock:
            return self._processing

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop accepting work, wait for the in-flight worker, then drain what is pending.

        The drain skips the pause between contexts. Returns ``False`` when ``timeout`` ran out
        first or processing failed (work was lost), ``True`` otherwise. Safe to call twice.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._lock:
            self._closed = True
            self._stopping.set()
            self._cancel_timer_locked()
            while self._processing:
                remaining = _remaining(deadline)
                if remaining == 0.0:
                    logger.warning(
                        "memory queue shutdown timed out waiting for the running update; "
                        "%d pending conversation(s) not processed",
                        len(self._queue),
                    )
                    return False
                self._idle.wait(remaining)
            if not self._queue:
                return True
            batch = self._take_batch_locked()
        logger.info("memory queue shutdown: draining %d pending conversation(s)", len(batch))
        return self._drain(batch, deadline)

    # -- internals ---------------------------------------------------------------------------

    def _enqueue(self, context: ConversationContext, *, delay: float | None) -> None:
        config = get_memory_config()
        if not config.enabled:
            return
        with self._lock:
            if self._closed:
                logger.warning(
                    "memory queue is shut down; dropping the update for thread %s", context.thread_id
                )
                return
            previous = next((item for item in self._queue if item.key == context.key), None)
            if previous is not None:
                # Flags stay sticky until processed: a later turn without a correction must not
                # erase the hint that an earlier turn of the same conversation carried one.
                context.correction_detected |= previous.correction_detected
                context.reinforcement_detected |= previous.reinforcement_detected
                self._queue.remove(previous)
            self._queue.append(context)
            self._schedule_timer_locked(float(config.debounce_seconds) if delay is None else delay)

    def _schedule_timer_locked(self, delay: float) -> None:
        if self._closed:
            return
        self._cancel_timer_locked()
        timer = threading.Timer(delay, self._process_queue)
        timer.daemon = True
        timer.start()
        self._timer = timer

    def _cancel_timer_locked(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _take_batch_locked(self) -> list[ConversationContext]:
        # The batch takes everything, so a timer scheduled meanwhile has nothing left to do.
        self._cancel_timer_locked()
        batch = self._queue
        self._queue = []
        self._processing = True
        return batch

    def _process_queue(self) -> None:
        with self._lock:
            if self._processing:
                self._rerun_pending = True
                return
            if not self._queue:
                return
            batch = self._take_batch_locked()
        try:
            self._run_batch(batch, interval=self._batch_interval)
        finally:
            self._finish_batch()

    def _finish_batch(self) -> None:
        with self._lock:
            self._processing = False
            if self._rerun_pending:
                self._rerun_pending = False
                if self._queue:
                    self._schedule_timer_locked(0.0)
            self._idle.notify_all()

    def _run_batch(
        self, batch: list[ConversationContext], *, interval: float, deadline: float | None = None
    ) -> bool:
        """Hand each context to the updater; ``False`` if any of them was lost to an error."""
        try:
            updater = self._updater_factory()
        except Exception:
            logger.exception("could not create the memory updater; %d conversation(s) lost", len(batch))
            return False
        ok = True
        for index, context in enumerate(batch):
            if deadline is not None and time.monotonic() >= deadline:
                logger.warning(
                    "memory queue drain ran out of time; %d conversation(s) not processed",
                    len(batch) - index,
                )
                return False
            if index and interval > 0:
                self._stopping.wait(interval)
            try:
                updated = updater.update_memory(
                    messages=context.messages,
                    thread_id=context.thread_id,
                    agent_name=context.agent_name,
                    correction_detected=context.correction_detected,
                    reinforcement_detected=context.reinforcement_detected,
                    user_id=context.user_id,
                    captured_at=context.timestamp,
                )
            except Exception:
                ok = False
                logger.exception("memory update raised for thread %s", context.thread_id)
                continue
            if updated:
                logger.debug("memory updated for thread %s", context.thread_id)
            else:
                logger.info("memory update skipped or failed for thread %s", context.thread_id)
        return ok

    def _drain(self, batch: list[ConversationContext], deadline: float | None) -> bool:
        outcome: list[bool] = []

        def run() -> None:
            try:
                outcome.append(self._run_batch(batch, interval=0.0, deadline=deadline))
            finally:
                self._finish_batch()

        # A helper thread lets a stuck LLM call overrun without blocking exit past the deadline.
        worker = threading.Thread(target=run, name="memstore-queue-drain", daemon=True)
        try:
            worker.start()
        except RuntimeError:
            # Python 3.12+ refuses new threads inside atexit handlers: drain inline instead.
            run()
            return outcome == [True]
        worker.join(_remaining(deadline))
        if worker.is_alive():
            logger.warning("memory queue shutdown timed out while draining pending conversations")
            return False
        return outcome == [True]


_queue: MemoryUpdateQueue | None = None
_queue_lock = threading.Lock()
_atexit_registered = False


def get_memory_queue() -> MemoryUpdateQueue:
    """The process-wide queue, created on first use; it is drained at interpreter exit."""
    global _queue, _atexit_registered
    with _queue_lock:
        if _queue is None:
            _queue = MemoryUpdateQueue()
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
        return _queue


def set_memory_queue(queue: MemoryUpdateQueue) -> None:
    """Install ``queue`` as the process-wide one, e.g. built with a custom updater factory."""
    global _queue
    with _queue_lock:
        _queue = queue


def reset_memory_queue() -> None:
    """Discard the process-wide queue and its pending work (tests, config changes)."""
    global _queue
    with _queue_lock:
        queue, _queue = _queue, None
    if queue is not None:
        queue.clear()


def _shutdown_at_exit() -> None:
    with _queue_lock:
        queue = _queue
    if queue is None:
        return
    try:
        timeout = get_memory_config().shutdown_timeout_seconds
    except Exception:
        logger.exception("memory config unavailable at exit; using the default shutdown timeout")
        timeout = MemoryConfig().shutdown_timeout_seconds
    queue.shutdown(timeout)
