"""The debounced update queue between the request path and the (slow) LLM updater.

Turns are batched per conversation key ``(tenant_id, thread_id, user_id, agent_name)``: the
newest messages for a key replace the older ones, because the middleware always sends the whole
filtered thread; the same thread in two tenants is two conversations, each saved in its tenant.
One global timer covers the queue, so a burst of turns costs one batch; a steady stream of turns
pushes it back at most until the oldest pending turn has waited
``MAX_DEBOUNCE_FACTOR`` debounce periods, so busy traffic cannot starve the queue.
At most one worker runs at a time; a trigger that arrives while it is busy only leaves a
note, and the finishing worker schedules exactly one follow-up (no 0-delay timer spin).

Beyond the reference, ``shutdown`` drains pending work so a deploy or SIGTERM loses nothing;
once it has run, new turns are dropped with a warning because the process is going away.

Outages are not failures: when the updater raises ``StorageUnavailableError`` the conversation
goes back into the queue with exponential backoff (``update_retry_base_seconds`` doubling up to
``update_retry_max_seconds``) until ``update_max_attempts`` is used up. A newer conversation for
the same key that arrived meanwhile wins, because it carries the whole thread. Every other error
is permanent (a bad LLM reply stays bad) and is never retried.

What the queue may hold, and which turns it drops when full, is ``bounds.py``'s: the depth, a
correction reserve and a character cap. Each conversation is kept as text only (``text_only``).
"""

from __future__ import annotations

import logging
import threading
import time

from memstore.capture.conversation import ConversationContext, ConversationKey
from memstore.capture.filtering import bound_conversation
from memstore.capture.message_access import text_only
from memstore.config import get_memory_config
from memstore.errors import StorageUnavailableError
from memstore.metrics import count_rejection
from memstore.queue.bounds import (
    MAX_QUEUED_CONVERSATION_CHARS,
    MAX_QUEUED_MESSAGE_CHARS,
    QueueBudget,
    conversation_chars,
)
from memstore.queue.contract import ConversationUpdater, QueueStats, UpdateQueue, UpdaterFactory
from memstore.queue.retry import retry_delay
from memstore.update.updater import MemoryUpdater

logger = logging.getLogger(__name__)

MAX_DEBOUNCE_FACTOR = 2


def _default_updater_factory() -> ConversationUpdater:
    # Built per batch, so the updater reads the configuration current at processing time.
    return MemoryUpdater()


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class MemoryUpdateQueue(UpdateQueue):
    """Thread-safe debounced queue; see the module docstring for the scheduling rules."""

    def __init__(self, updater_factory: UpdaterFactory | None = None) -> None:
        self._updater_factory = updater_factory or _default_updater_factory
        # Insertion-ordered by key: O(1) coalescing however deep the queue gets.
        self._queue: dict[ConversationKey, ConversationContext] = {}
        self._budget = QueueBudget()
        # Earliest ``not_before`` among waiting retries (may be early after a supersede, never late).
        self._next_retry: float | None = None
        self._counts: dict[str, int] = dict.fromkeys(QueueStats.__dataclass_fields__, 0)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._timer: threading.Timer | None = None
        self._timer_due = 0.0
        # When the oldest turn not yet taken by a batch arrived (caps how far debouncing defers it).
        self._pending_since: float | None = None
        self._processing = False
        self._rerun_pending = False
        self._closed = False

    def submit(self, context: ConversationContext, *, immediately: bool = False) -> None:
        """Queue ``context``; restart the debounce timer, or process the whole queue now (background)."""
        self._enqueue(context, delay=0.0 if immediately else None)

    def flush(self) -> None:
        """Process everything pending in the caller's thread, retries still backing off included.

        If a worker is already busy this returns at once; that worker picks the queue up next.
        """
        with self._lock:
            self._cancel_timer_locked()
        self._process_queue(force=True)

    def flush_nowait(self) -> None:
        """Process everything pending now, on a background thread."""
        with self._lock:
            self._schedule_timer_locked(0.0)

    def clear(self) -> None:
        """Drop pending work and the timer; an in-flight worker finishes its own batch."""
        with self._lock:
            self._cancel_timer_locked()
            self._queue.clear()
            self._budget.clear()
            self._next_retry = None
            self._pending_since = None
            self._rerun_pending = False
            self._idle.notify_all()

    def close(self) -> None:
        """Discard the queue (tests, a config change): pending work is dropped, like ``clear``."""
        self.clear()

    @property
    def pending_count(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def is_processing(self) -> bool:
        with self._lock:
            return self._processing

    @property
    def stats(self) -> QueueStats:
        with self._lock:
            return QueueStats(**self._counts)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending or running; ``False`` if ``timeout`` ran out first."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._lock:
            while self._queue or self._processing:
                remaining = _remaining(deadline)
                if remaining == 0.0:
                    return False
                self._idle.wait(remaining)
            return True

    def shutdown(self, timeout: float | None = None) -> bool:
        """Stop accepting work, wait for the in-flight worker, then drain what is pending.

        Returns ``False`` when ``timeout`` ran out
        first or processing failed (work was lost), ``True`` otherwise. Safe to call twice.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._lock:
            self._closed = True
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
            batch = self._take_batch_locked(force=True)
        logger.info("memory queue shutdown: draining %d pending conversation(s)", len(batch))
        return self._drain(batch, deadline)

    # -- internals ---------------------------------------------------------------------------

    def _enqueue(self, context: ConversationContext, *, delay: float | None) -> None:
        config = get_memory_config()
        if not config.enabled:
            return
        bounded = bound_conversation(
            context.messages,
            max_message_chars=MAX_QUEUED_MESSAGE_CHARS,
            max_total_chars=MAX_QUEUED_CONVERSATION_CHARS,
        )
        context.messages = [text_only(message) for message in bounded]
        chars = conversation_chars(context.messages)
        with self._lock:
            if self._closed:
                logger.warning(
                    "memory queue is shut down; dropping the update for thread %s", context.thread_id
                )
                return
            full = self._budget.refusal(
                config, context.key, chars, depth=len(self._queue), correction=context.correction_detected
            )
            if full is not None:
                self._counts["rejected_full"] += 1
                count_rejection("rejected_full")
                logger.warning(
                    "memory queue is full (%s); dropping the update for thread %s (%d dropped so far)",
                    full,
                    context.thread_id,
                    self._counts["rejected_full"],
                )
                return
            previous = self._queue.pop(context.key, None)
            if previous is not None:
                # Flags stay sticky until processed: a later turn without a correction must not
                # erase the hint that an earlier turn of the same conversation carried one.
                context.correction_detected |= previous.correction_detected
                context.reinforcement_detected |= previous.reinforcement_detected
                if previous.not_before:
                    self._next_retry = self._earliest_retry_locked()
            self._queue[context.key] = context
            self._budget.put(context.key, chars)
            self._counts["accepted"] += 1
            now = time.monotonic()
            if self._pending_since is None:
                self._pending_since = now
            if delay is None:
                debounce = float(config.debounce_seconds)
                delay = max(0.0, min(debounce, self._pending_since + MAX_DEBOUNCE_FACTOR * debounce - now))
            self._schedule_timer_locked(delay)

    def _earliest_retry_locked(self) -> float | None:
        return min((item.not_before for item in self._queue.values() if item.not_before), default=None)

    def _schedule_timer_locked(self, delay: float) -> None:
        if self._closed:
            return
        if self._next_retry is not None:
            # A debounce restart must not push a due retry back.
            delay = min(delay, max(0.0, self._next_retry - time.monotonic()))
        self._cancel_timer_locked()
        timer = threading.Timer(delay, self._process_queue)
        timer.daemon = True
        timer.start()
        self._timer = timer
        self._timer_due = time.monotonic() + delay

    def _cancel_timer_locked(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _take_batch_locked(self, *, force: bool) -> list[ConversationContext]:
        """Everything due (or everything, with ``force``); retries still backing off stay queued.

        The timer is cancelled because the batch takes all that is due; whatever stays is
        rescheduled by ``_finish_batch``.
        """
        self._cancel_timer_locked()
        now = time.monotonic()
        batch = [item for item in self._queue.values() if force or item.not_before <= now]
        if len(batch) == len(self._queue):
            self._queue = {}
        else:
            for item in batch:
                del self._queue[item.key]
        self._budget.take(item.key for item in batch)
        self._next_retry = self._earliest_retry_locked()
        self._pending_since = None
        self._processing = bool(batch)
        return batch

    def _process_queue(self, *, force: bool = False) -> None:
        with self._lock:
            if self._processing:
                self._rerun_pending = True
                return
            if not self._queue:
                return
            batch = self._take_batch_locked(force=force)
            if not batch:
                self._schedule_pending_locked()
                return
        try:
            self._run_batch(batch)
        finally:
            self._finish_batch()

    def _schedule_pending_locked(self) -> None:
        """Wake up for retries that are still backing off (fresh entries always have a timer)."""
        if self._next_retry is None:
            return
        if self._timer is None or self._next_retry < self._timer_due:
            self._schedule_timer_locked(max(0.0, self._next_retry - time.monotonic()))

    def _finish_batch(self) -> None:
        with self._lock:
            self._processing = False
            self._budget.batch_done()
            if self._rerun_pending:
                self._rerun_pending = False
                if self._queue:
                    self._schedule_timer_locked(0.0)
            self._schedule_pending_locked()
            self._idle.notify_all()

    def _run_batch(self, batch: list[ConversationContext], *, deadline: float | None = None) -> bool:
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
            try:
                updated = updater.update(context)
            except StorageUnavailableError as exc:
                ok = self._retry_later(context, exc) and ok
                continue
            except Exception:
                ok = False
                self._count("errors")
                logger.exception("memory update raised for thread %s", context.thread_id)
                continue
            if updated:
                self._count("updated")
                logger.debug("memory updated for thread %s", context.thread_id)
            else:
                self._count("skipped")
                logger.info("memory update skipped or failed for thread %s", context.thread_id)
        return ok

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _retry_later(self, context: ConversationContext, exc: StorageUnavailableError) -> bool:
        """Put ``context`` back after an outage; ``False`` when it had to be dropped instead."""
        config = get_memory_config()
        attempts = context.attempts + 1
        with self._lock:
            newer = self._queue.get(context.key)
            if newer is not None:
                # The newer turn carries the whole thread; only the flags need carrying over.
                newer.correction_detected |= context.correction_detected
                newer.reinforcement_detected |= context.reinforcement_detected
                logger.info(
                    "memory store unavailable for thread %s; a newer turn is queued and replaces it: %s",
                    context.thread_id,
                    exc,
                )
                return True
            if attempts >= config.update_max_attempts or self._closed:
                self._counts["abandoned"] += 1
                reason = "the queue is shut down" if self._closed else f"{attempts} attempt(s)"
                logger.error(
                    "memory store unavailable for thread %s; conversation dropped after %s: %s",
                    context.thread_id,
                    reason,
                    exc,
                )
                return False
            delay = retry_delay(attempts, config)
            context.attempts = attempts
            context.not_before = time.monotonic() + delay
            self._queue[context.key] = context
            self._budget.put(context.key, conversation_chars(context.messages))
            self._next_retry = min(self._next_retry or context.not_before, context.not_before)
            self._counts["retries"] += 1
        logger.warning(
            "memory store unavailable for thread %s (attempt %d of %d); retrying in %.2f s: %s",
            context.thread_id,
            attempts,
            config.update_max_attempts,
            delay,
            exc,
        )
        return True

    def _drain(self, batch: list[ConversationContext], deadline: float | None) -> bool:
        outcome: list[bool] = []

        def run() -> None:
            try:
                outcome.append(self._run_batch(batch, deadline=deadline))
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
