"""Queue rules for outages that the end-to-end outage test cannot time precisely.

The updater here is a scripted stand-in passed through the queue's public ``updater_factory``:
it raises ``StorageUnavailableError`` on cue and lets the test act while a call is in flight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig
from memstore.errors import StorageUnavailableError
from memstore.queue import MemoryUpdateQueue, retry_delay
from tests.reliability.conftest import configure
from tests.reliability.llm_script import turn


class ScriptedUpdater:
    def __init__(self, during_call: Callable[[int], None] = lambda call: None, outages: int = 0) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.during_call = during_call
        self.outages = outages

    def update(self, context: ConversationContext) -> bool:
        self.calls.append((context.messages[0]["content"], context.correction_detected))
        self.during_call(len(self.calls))
        if len(self.calls) <= self.outages:
            raise StorageUnavailableError("database is down")
        return True


def test_a_failed_context_never_overwrites_a_newer_one_for_its_key(isolated_config: MemoryConfig) -> None:
    configure(data_dir=isolated_config.data_dir, update_retry_base_seconds=0.05)
    queue: MemoryUpdateQueue

    def newer_turn_arrives(call: int) -> None:
        if call == 1:
            queue.add(thread_id="t", messages=turn("second, whole thread"), user_id="u")

    updater = ScriptedUpdater(newer_turn_arrives, outages=1)
    queue = MemoryUpdateQueue(lambda: updater)
    queue.add(thread_id="t", messages=turn("first"), user_id="u", correction_detected=True)
    queue.flush()

    assert queue.pending_count == 1
    [pending] = queue._queue.values()
    assert pending.messages[0]["content"] == "second, whole thread"
    assert pending.correction_detected, "the failed turn's correction flag must carry over"
    assert pending.attempts == 0
    queue.flush()
    assert updater.calls == [("first", True), ("second, whole thread", True)]
    assert (queue.stats.retries, queue.stats.updated, queue.stats.abandoned) == (0, 1, 0)


def test_a_retry_is_processed_without_waiting_for_traffic(isolated_config: MemoryConfig) -> None:
    configure(data_dir=isolated_config.data_dir, update_retry_base_seconds=0.05, debounce_seconds=300)
    updater = ScriptedUpdater(outages=2)
    queue = MemoryUpdateQueue(lambda: updater)
    queue.add_nowait(thread_id="t", messages=turn("only"), user_id="u")
    assert queue.wait_idle(30)
    assert [text for text, _ in updater.calls] == ["only"] * 3
    assert (queue.stats.retries, queue.stats.updated) == (2, 1)


def test_backoff_doubles_and_is_capped() -> None:
    config = MemoryConfig(update_retry_base_seconds=2, update_retry_max_seconds=30)
    assert [retry_delay(n, config) for n in range(1, 8)] == [2, 4, 8, 16, 30, 30, 30]
    assert retry_delay(10_000, config) == 30


def test_steady_traffic_cannot_postpone_processing_forever(isolated_config: MemoryConfig) -> None:
    configure(data_dir=isolated_config.data_dir, debounce_seconds=1)
    processed = threading.Event()

    class Recorder(ScriptedUpdater):
        def update(self, context: ConversationContext) -> bool:
            processed.set()
            return True

    queue = MemoryUpdateQueue(lambda: Recorder())
    deadline = time.monotonic() + 6.0  # three times the longest a turn may now wait
    sent = 0
    while not processed.is_set() and time.monotonic() < deadline:
        queue.add(thread_id=f"t{sent}", messages=turn(f"turn {sent}"), user_id="u")
        sent += 1
        time.sleep(0.2)  # always sooner than the debounce
    assert processed.is_set(), f"nothing processed after {sent} turns arriving faster than the debounce"
    queue.clear()
