"""The debounced update queue: coalescing, scheduling, thread hand-off and shutdown drain."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig, set_memory_config
from memstore.gateway.user_context import get_effective_user_id, reset_current_user, set_current_user
from memstore.queue import (
    DatabaseUpdateQueue,
    MemoryUpdateQueue,
    get_memory_queue,
    reset_memory_queue,
    set_memory_queue,
)
from tests.support.recording_updater import RecordingUpdater


def _turn(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": f"re: {text}"}]


class CountingQueue(MemoryUpdateQueue):
    """Records every timer the queue starts, so tests can count schedules and join them."""

    def __init__(self, updater: RecordingUpdater) -> None:
        super().__init__(updater.factory)
        self.timers: list[tuple[float, threading.Timer]] = []

    def _schedule_timer_locked(self, delay: float) -> None:
        super()._schedule_timer_locked(delay)
        if self._timer is not None and all(timer is not self._timer for _, timer in self.timers):
            self.timers.append((delay, self._timer))

    @property
    def delays(self) -> list[float]:
        return [delay for delay, _ in self.timers]


@pytest.fixture(autouse=True)
def _fresh_queue() -> Iterator[None]:
    reset_memory_queue()
    yield
    reset_memory_queue()


@pytest.fixture
def queue(updater: RecordingUpdater) -> Iterator[MemoryUpdateQueue]:
    q = MemoryUpdateQueue(updater.factory)
    yield q
    q.clear()


def test_conversation_context_defaults() -> None:
    context = ConversationContext("t1", [])
    assert (context.agent_name, context.user_id) == (None, None)
    assert not context.correction_detected and not context.reinforcement_detected
    assert context.timestamp.tzinfo is not None


def test_same_key_coalesces_to_latest_messages_with_sticky_flags(
    queue: MemoryUpdateQueue, updater: RecordingUpdater
) -> None:
    queue.add(thread_id="t1", messages=_turn("first"), correction_detected=True)
    queue.add(thread_id="t1", messages=_turn("second"), reinforcement_detected=True)
    queue.add(thread_id="t1", messages=_turn("third"))
    assert queue.pending_count == 1

    queue.flush()

    [call] = updater.calls
    assert call.texts == ["third", "re: third"]
    assert (call.thread_id, call.user_id, call.agent_name) == ("t1", None, None)
    assert call.correction_detected and call.reinforcement_detected


def test_coalesced_entry_moves_to_the_end(queue: MemoryUpdateQueue, updater: RecordingUpdater) -> None:
    queue.add(thread_id="a", messages=_turn("a1"))
    queue.add(thread_id="b", messages=_turn("b1"))
    queue.add(thread_id="a", messages=_turn("a2"))

    queue.flush()

    assert [(call.thread_id, call.texts[0]) for call in updater.calls] == [("b", "b1"), ("a", "a2")]


def test_different_users_and_agents_on_one_thread_stay_separate(
    queue: MemoryUpdateQueue, updater: RecordingUpdater
) -> None:
    queue.add(thread_id="t", messages=_turn("alice"), user_id="alice")
    queue.add(thread_id="t", messages=_turn("bob"), user_id="bob")
    queue.add(thread_id="t", messages=_turn("alice-coder"), user_id="alice", agent_name="coder")
    queue.add(thread_id="t", messages=_turn("alice again"), user_id="alice")
    assert queue.pending_count == 3

    queue.flush()

    assert [(c.user_id, c.agent_name, c.texts[0]) for c in updater.calls] == [
        ("bob", None, "bob"),
        ("alice", "coder", "alice-coder"),
        ("alice", None, "alice again"),
    ]


def test_add_nowait_obeys_the_same_key(queue: MemoryUpdateQueue, updater: RecordingUpdater) -> None:
    queue.add(thread_id="t", messages=_turn("alice"), user_id="alice")
    queue.add_nowait(thread_id="t", messages=_turn("bob"), user_id="bob")

    calls = updater.wait_for_calls(2)

    assert sorted(c.user_id or "" for c in calls) == ["alice", "bob"]


def test_one_debounce_timer_for_the_whole_queue() -> None:
    set_memory_config(MemoryConfig(debounce_seconds=1))
    updater = RecordingUpdater()
    queue = CountingQueue(updater)

    queue.add(thread_id="a", messages=_turn("a"))
    time.sleep(0.4)
    queue.add(thread_id="b", messages=_turn("b"))
    last_add = time.monotonic()
    first_timer = queue.timers[0][1]

    calls = updater.wait_for_calls(2)

    assert queue.delays == [1.0, 1.0]
    assert not first_timer.is_alive()
    assert updater.factory_calls == 1, "both conversations must be processed in one batch"
    assert calls[0].at - last_add >= 0.9, "the second add must push the whole queue back"
    assert [c.thread_id for c in calls] == ["a", "b"]


def test_add_nowait_and_flush_nowait_fire_immediately(updater: RecordingUpdater) -> None:
    queue = CountingQueue(updater)
    queue.add(thread_id="a", messages=_turn("a"))
    queue.add_nowait(thread_id="b", messages=_turn("b"))
    updater.wait_for_calls(2)

    queue.add(thread_id="c", messages=_turn("c"))
    started = time.monotonic()
    queue.flush_nowait()
    assert time.monotonic() - started < 0.1
    updater.wait_for_calls(3)

    assert queue.delays == [30.0, 0.0, 30.0, 0.0]


def test_busy_worker_sets_a_rerun_flag_instead_of_spinning(updater: RecordingUpdater) -> None:
    gate = threading.Event()
    updater.gate = gate
    queue = CountingQueue(updater)
    queue.add_nowait(thread_id="a", messages=_turn("a"))
    assert updater.started.wait(5)

    queue.add_nowait(thread_id="b", messages=_turn("b"))
    queue.add_nowait(thread_id="c", messages=_turn("c"))
    for _, trigger in queue.timers[1:]:
        trigger.join(5)
    # The two triggers found the worker busy and returned without scheduling anything.
    assert queue.delays == [0.0, 0.0, 0.0]
    assert queue.is_processing and queue.pending_count == 2

    gate.set()
    calls = updater.wait_for_calls(3)

    assert [c.thread_id for c in calls] == ["a", "b", "c"]
    assert queue.delays == [0.0, 0.0, 0.0, 0.0], "the finishing worker schedules exactly one follow-up"
    assert updater.factory_calls == 2


def test_finishing_worker_does_not_reschedule_an_empty_queue(updater: RecordingUpdater) -> None:
    gate = threading.Event()
    updater.gate = gate
    queue = CountingQueue(updater)
    queue.add_nowait(thread_id="a", messages=_turn("a"))
    assert updater.started.wait(5)
    queue.flush_nowait()
    queue.timers[-1][1].join(5)

    gate.set()
    updater.wait_for_calls(1)
    queue.timers[0][1].join(5)

    assert queue.delays == [0.0, 0.0]
    assert not queue.is_processing


def test_flush_runs_synchronously_in_the_callers_thread(
    queue: MemoryUpdateQueue, updater: RecordingUpdater
) -> None:
    queue.add(thread_id="a", messages=_turn("a"))
    queue.add(thread_id="b", messages=_turn("b"))

    queue.flush()

    assert [c.thread_id for c in updater.calls] == ["a", "b"]
    assert all(c.worker_thread is threading.current_thread() for c in updater.calls)
    assert queue.pending_count == 0 and not queue.is_processing


def test_batch_runs_contexts_back_to_back(updater: RecordingUpdater) -> None:
    """No fixed pause between conversations: it alone capped a process at 2 updates/s."""
    queue = MemoryUpdateQueue(updater.factory)
    for name in ("a", "b", "c"):
        queue.add(thread_id=name, messages=_turn(name))

    queue.flush()

    gaps = [later.at - earlier.at for earlier, later in zip(updater.calls, updater.calls[1:], strict=False)]
    assert len(gaps) == 2 and all(gap < 0.1 for gap in gaps)


def test_user_captured_at_enqueue_reaches_the_worker_thread(
    queue: MemoryUpdateQueue, updater: RecordingUpdater
) -> None:
    token = set_current_user("alice")
    try:
        queue.add(thread_id="t", messages=_turn("hi"), user_id=get_effective_user_id())
    finally:
        reset_current_user(token)

    queue.flush_nowait()
    [call] = updater.wait_for_calls(1)

    assert call.worker_thread is not threading.current_thread()
    assert call.ambient_user_id == "default", "the worker thread does not see the request's ContextVar"
    assert call.user_id == "alice"


def test_updater_exception_does_not_lose_other_contexts_or_kill_the_queue(
    updater: RecordingUpdater, caplog: pytest.LogCaptureFixture
) -> None:
    updater.fail_threads = frozenset({"bad"})
    queue = MemoryUpdateQueue(updater.factory)
    queue.add(thread_id="bad", messages=_turn("bad"))
    queue.add(thread_id="good", messages=_turn("good"))

    with caplog.at_level(logging.ERROR, logger="memstore.queue"):
        queue.flush()

    assert [c.thread_id for c in updater.calls] == ["bad", "good"]
    assert any("bad" in record.getMessage() for record in caplog.records)

    queue.add_nowait(thread_id="later", messages=_turn("later"))
    assert updater.wait_for_calls(3)[-1].thread_id == "later"
    assert not queue.is_processing


def test_failing_updater_factory_does_not_kill_the_queue(updater: RecordingUpdater) -> None:
    attempts: list[int] = []

    def flaky_factory() -> RecordingUpdater:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("no model configured")
        return updater

    queue = MemoryUpdateQueue(flaky_factory)
    queue.add(thread_id="lost", messages=_turn("lost"))
    queue.flush()
    assert not queue.is_processing

    queue.add(thread_id="kept", messages=_turn("kept"))
    queue.flush()
    assert [c.thread_id for c in updater.calls] == ["kept"]


def test_disabled_memory_enqueues_nothing(queue: MemoryUpdateQueue, updater: RecordingUpdater) -> None:
    set_memory_config(MemoryConfig(enabled=False))
    queue.add(thread_id="t", messages=_turn("a"))
    queue.add_nowait(thread_id="t", messages=_turn("b"))
    queue.flush()

    assert queue.pending_count == 0
    assert updater.calls == []


def test_clear_drops_pending_work(queue: MemoryUpdateQueue, updater: RecordingUpdater) -> None:
    queue.add(thread_id="t", messages=_turn("a"))
    queue.clear()
    queue.flush()

    assert queue.pending_count == 0
    assert updater.calls == []


def test_shutdown_when_idle_returns_true_at_once(queue: MemoryUpdateQueue) -> None:
    started = time.monotonic()
    assert queue.shutdown(timeout=5) is True
    assert time.monotonic() - started < 0.5


def test_shutdown_drains_pending_work(updater: RecordingUpdater, caplog: pytest.LogCaptureFixture) -> None:
    queue = MemoryUpdateQueue(updater.factory)
    for name in ("a", "b", "c"):
        queue.add(thread_id=name, messages=_turn(name))

    started = time.monotonic()
    assert queue.shutdown(timeout=5) is True

    assert time.monotonic() - started < 2
    assert [c.thread_id for c in updater.calls] == ["a", "b", "c"]
    assert queue.pending_count == 0

    with caplog.at_level(logging.WARNING, logger="memstore.queue"):
        queue.add(thread_id="late", messages=_turn("late"))
    assert queue.pending_count == 0
    assert any("shut down" in record.getMessage() for record in caplog.records)
    assert queue.shutdown(timeout=1) is True


def test_shutdown_waits_for_the_in_flight_worker_then_drains(updater: RecordingUpdater) -> None:
    gate = threading.Event()
    updater.gate = gate
    queue = MemoryUpdateQueue(updater.factory)
    queue.add_nowait(thread_id="running", messages=_turn("running"))
    assert updater.started.wait(5)
    queue.add(thread_id="pending", messages=_turn("pending"))

    releaser = threading.Timer(0.2, gate.set)
    releaser.start()
    assert queue.shutdown(timeout=5) is True
    releaser.join()

    assert [c.thread_id for c in updater.calls] == ["running", "pending"]


def test_shutdown_returns_false_when_the_timeout_runs_out(updater: RecordingUpdater) -> None:
    gate = threading.Event()
    updater.gate = gate
    queue = MemoryUpdateQueue(updater.factory)
    queue.add(thread_id="slow", messages=_turn("slow"))

    started = time.monotonic()
    try:
        assert queue.shutdown(timeout=0.3) is False
        assert time.monotonic() - started < 2
    finally:
        gate.set()
    updater.wait_for_calls(1)


def test_shutdown_returns_false_when_an_in_flight_worker_outlasts_the_timeout(
    updater: RecordingUpdater,
) -> None:
    gate = threading.Event()
    updater.gate = gate
    queue = MemoryUpdateQueue(updater.factory)
    queue.add_nowait(thread_id="slow", messages=_turn("slow"))
    assert updater.started.wait(5)
    try:
        assert queue.shutdown(timeout=0.2) is False
    finally:
        gate.set()


def test_shutdown_returns_false_when_the_drain_fails(updater: RecordingUpdater) -> None:
    updater.fail_threads = frozenset({"bad"})
    queue = MemoryUpdateQueue(updater.factory)
    queue.add(thread_id="bad", messages=_turn("bad"))
    queue.add(thread_id="good", messages=_turn("good"))

    assert queue.shutdown(timeout=5) is False
    assert [c.thread_id for c in updater.calls] == ["bad", "good"]


def test_process_singleton_and_reset(isolated_config: MemoryConfig) -> None:
    """A memory queue's pending work goes with a reset; the database queue's survives it."""
    set_memory_config(isolated_config.model_copy(update={"queue_backend": "memory"}))
    first = get_memory_queue()
    assert isinstance(first, MemoryUpdateQueue) and get_memory_queue() is first
    first.add(thread_id="t", messages=_turn("a"))

    reset_memory_queue()

    assert first.pending_count == 0
    set_memory_config(isolated_config)
    durable = get_memory_queue()
    assert isinstance(durable, DatabaseUpdateQueue)
    durable.add(thread_id="t", messages=_turn("a"))
    reset_memory_queue()
    assert durable.pending_count == 1, "queued in the database, not in the discarded object"

    custom = MemoryUpdateQueue(RecordingUpdater().factory)
    set_memory_queue(custom)
    assert get_memory_queue() is custom
