"""MemoryMiddleware: capture a finished turn into the real queue, and build the injected block."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from sqlalchemy import text

from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig
from memstore.errors import InvalidScopeError, SchemaNotReadyError
from memstore.gateway.middleware import MemoryMiddleware
from memstore.gateway.user_context import reset_current_user, set_current_user
from memstore.ops.facts import create_memory_fact, get_memory_data
from memstore.queue import MemoryUpdateQueue, get_memory_queue, reset_memory_queue
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql.engine import database_url_from_config, get_engine
from memstore.storage.sql.schema import migrate
from tests.support.recording_updater import RecordingUpdater


def _thread(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Question"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "1", "name": "search", "args": {}}]},
        {"role": "tool", "content": "tool output"},
        {"role": "assistant", "content": "Final answer"},
        *extra,
    ]


def test_after_agent_queues_the_filtered_turn(queue: MemoryUpdateQueue, updater: RecordingUpdater) -> None:
    MemoryMiddleware("coder").after_agent(_thread(), thread_id="t1", user_id="alice")

    assert queue.pending_count == 1, "the turn waits for the debounce instead of blocking the request"
    assert updater.calls == []
    queue.flush()

    [call] = updater.calls
    assert call.texts == ["Question", "Final answer"]
    assert (call.thread_id, call.agent_name, call.user_id) == ("t1", "coder", "alice")
    assert not call.correction_detected and not call.reinforcement_detected


def test_user_is_captured_from_the_request_at_enqueue_time(
    queue: MemoryUpdateQueue, updater: RecordingUpdater
) -> None:
    token = set_current_user("alice")
    try:
        MemoryMiddleware().after_agent(_thread(), thread_id="t1")
    finally:
        reset_current_user(token)

    queue.flush_nowait()
    [call] = updater.wait_for_calls(1)

    assert call.worker_thread is not threading.current_thread()
    assert call.ambient_user_id == "default"
    assert call.user_id == "alice"


def test_correction_suppresses_reinforcement(queue: MemoryUpdateQueue, updater: RecordingUpdater) -> None:
    messages = _thread(
        {"role": "user", "content": "Perfect."},
        {"role": "assistant", "content": "Glad it helped"},
        {"role": "user", "content": "Actually that's wrong, try again"},
        {"role": "assistant", "content": "Fixed"},
    )
    MemoryMiddleware().after_agent(messages, thread_id="t1")
    MemoryMiddleware().after_agent(_thread({"role": "user", "content": "Perfect."}), thread_id="t2")
    queue.flush()

    flags = {c.thread_id: (c.correction_detected, c.reinforcement_detected) for c in updater.calls}
    assert flags == {"t1": (True, False), "t2": (False, True)}


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Question"}],
        [{"role": "assistant", "content": "Unprompted answer"}],
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}],
        [],
    ],
)
def test_needs_a_user_message_and_an_answer(
    queue: MemoryUpdateQueue, updater: RecordingUpdater, messages: list[dict[str, Any]]
) -> None:
    MemoryMiddleware().after_agent(messages, thread_id="t1")
    queue.flush()

    assert queue.pending_count == 0 and updater.calls == []


def test_disabled_or_threadless_turns_are_not_queued(
    queue: MemoryUpdateQueue, updater: RecordingUpdater
) -> None:
    MemoryMiddleware(config=MemoryConfig(enabled=False)).after_agent(_thread(), thread_id="t1")
    MemoryMiddleware().after_agent(_thread(), thread_id="")
    queue.flush()

    assert updater.calls == []


def test_memory_context_returns_the_escaped_block() -> None:
    create_memory_fact("Writes <b>bold</b> & more", "preference", 0.9, user_id="alice")
    create_memory_fact("Agent-only fact", confidence=0.9, agent_name="coder", user_id="alice")

    block = MemoryMiddleware().memory_context(user_id="alice")

    assert block.startswith("<memory>\n") and block.endswith("\n</memory>\n")
    assert "Writes &lt;b&gt;bold&lt;/b&gt; &amp; more" in block
    assert "<b>" not in block
    assert "Agent-only fact" not in block
    assert "Agent-only fact" in MemoryMiddleware("coder").memory_context(user_id="alice")
    assert MemoryMiddleware().memory_context(user_id="bob") == ""


def test_memory_context_defaults_to_the_request_user() -> None:
    create_memory_fact("Carol's fact", confidence=0.9, user_id="carol")
    token = set_current_user("carol")
    try:
        block = MemoryMiddleware().memory_context()
    finally:
        reset_current_user(token)

    assert "Carol's fact" in block


@pytest.mark.parametrize("setting", [{"enabled": False}, {"injection_enabled": False}])
def test_memory_context_is_empty_when_switched_off(
    isolated_config: MemoryConfig, setting: dict[str, bool]
) -> None:
    create_memory_fact("Stored", confidence=0.9, user_id="alice")
    config = isolated_config.model_copy(update=setting)

    assert MemoryMiddleware(config=config).memory_context(user_id="alice") == ""


def test_memory_context_survives_a_storage_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_load(*_args: object, **_kwargs: object) -> None:
        raise OSError("the disk went away")

    monkeypatch.setattr(get_memory_storage(), "load", broken_load)
    with caplog.at_level(logging.ERROR, logger="memstore.gateway.middleware"):
        assert MemoryMiddleware().memory_context(user_id="alice") == ""

    assert any(record.exc_info for record in caplog.records)


def test_memory_context_raises_a_setup_error_instead_of_running_without_memory(
    isolated_config: MemoryConfig,
) -> None:
    """No turn would ever get memory, so the first one fails with what to do (issue 30 item 10)."""
    url = database_url_from_config(isolated_config)
    migrate.upgrade(url)
    with get_engine(url).begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    reset_memory_storage()
    with pytest.raises(SchemaNotReadyError, match="migrated by a newer memstore; upgrade memstore"):
        MemoryMiddleware().memory_context(user_id="alice")


def test_default_queue_feeds_the_real_updater() -> None:
    reset_memory_queue()
    try:
        MemoryMiddleware().after_agent(
            [{"role": "user", "content": "I prefer dark mode."}, {"role": "assistant", "content": "Noted."}],
            thread_id="t1",
            user_id="alice",
        )
        get_memory_queue().flush()
    finally:
        reset_memory_queue()

    facts = get_memory_data(user_id="alice")["facts"]
    assert any("dark mode" in fact["content"] and fact["source"] == "t1" for fact in facts)
    assert "dark mode" in MemoryMiddleware().memory_context(user_id="alice")


def test_an_oversized_thread_id_is_refused_not_cut() -> None:
    # Review of issue 13: the thread id becomes every new fact's source and a queue key, uncapped.
    with pytest.raises(InvalidScopeError, match="thread_id is 256 characters"):
        ConversationContext("t" * 256, [])
    assert ConversationContext("t" * 255, []).thread_id == "t" * 255
