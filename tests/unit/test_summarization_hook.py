"""memory_flush_hook: messages about to be summarized are queued and processed at once."""

from __future__ import annotations

from typing import Any

import pytest

from memstore.config import MemoryConfig, set_memory_config
from memstore.gateway.flush_hook import memory_flush_hook
from memstore.gateway.middleware import MemoryMiddleware
from memstore.gateway.user_context import reset_current_user, set_current_user
from memstore.queue import MemoryUpdateQueue
from tests.support.recording_updater import RecordingUpdater

DROPPED: list[dict[str, Any]] = [
    {"role": "user", "content": "Question"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "1", "name": "lookup", "args": {}}]},
    {"role": "tool", "content": "raw tool output"},
    {"role": "assistant", "content": "Final answer"},
]


@pytest.mark.usefixtures("queue")
def test_queues_filtered_messages_and_processes_them_without_a_flush(updater: RecordingUpdater) -> None:
    memory_flush_hook(DROPPED, thread_id="t1")

    [call] = updater.wait_for_calls(1)
    assert call.texts == ["Question", "Final answer"]
    assert (call.thread_id, call.agent_name, call.user_id) == ("t1", None, "default")
    assert not call.correction_detected and not call.reinforcement_detected


@pytest.mark.usefixtures("queue")
def test_keeps_the_agent_scope_and_the_user(updater: RecordingUpdater) -> None:
    memory_flush_hook(DROPPED, thread_id="t1", agent_name="coder", user_id="alice")
    token = set_current_user("carol")
    try:
        memory_flush_hook(DROPPED, thread_id="t2", agent_name="coder")
    finally:
        reset_current_user(token)

    calls = updater.wait_for_calls(2)
    assert sorted((c.thread_id, c.agent_name, c.user_id) for c in calls) == [
        ("t1", "coder", "alice"),
        ("t2", "coder", "carol"),
    ]


@pytest.mark.usefixtures("queue")
def test_detects_signals(updater: RecordingUpdater) -> None:
    messages: list[dict[str, Any]] = [
        *DROPPED,
        {"role": "user", "content": "No, that's wrong"},
        {"role": "assistant", "content": "Sorry"},
    ]
    memory_flush_hook(messages, thread_id="t1")

    [call] = updater.wait_for_calls(1)
    assert (call.correction_detected, call.reinforcement_detected) == (True, False)


def test_replaces_the_pending_debounced_turn_of_the_same_conversation(
    queue: MemoryUpdateQueue, updater: RecordingUpdater
) -> None:
    middleware = MemoryMiddleware()
    earlier = [
        {"role": "user", "content": "Old question. That's wrong, try again"},
        {"role": "assistant", "content": "Old answer"},
    ]
    middleware.after_agent(earlier, thread_id="t1", user_id="alice")
    assert queue.pending_count == 1

    memory_flush_hook(DROPPED, thread_id="t1", user_id="alice")

    [call] = updater.wait_for_calls(1)
    assert call.texts == ["Question", "Final answer"]
    assert call.correction_detected, "the pending turn's correction flag is merged, not lost"
    assert queue.pending_count == 0


def test_skips_when_disabled_or_without_a_thread(queue: MemoryUpdateQueue, updater: RecordingUpdater) -> None:
    memory_flush_hook(DROPPED, thread_id=None)
    memory_flush_hook(DROPPED, thread_id="")
    memory_flush_hook([{"role": "user", "content": "Only a question"}], thread_id="t1")
    set_memory_config(MemoryConfig(enabled=False))
    memory_flush_hook(DROPPED, thread_id="t1")

    queue.flush()
    assert queue.pending_count == 0
    assert updater.calls == []
