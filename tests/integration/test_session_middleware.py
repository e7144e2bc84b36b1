"""Session memory on the gateway's request path: ``MemoryMiddleware(session_memory=True)`` and
the LangChain middleware in a real ``create_agent`` loop with a checkpointer, on a real SQLite
file; and the expiry of sessions by the lifecycle run."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import SecretStr

from memstore.config import MemoryConfig, set_memory_config
from memstore.gateway.middleware import MemoryMiddleware
from memstore.gateway.user_context import reset_current_user, set_current_user
from memstore.integrations.langchain import LangChainMemoryMiddleware
from memstore.ops import sessions
from memstore.ops.lifecycle import run_lifecycle
from memstore.queue.process import get_memory_queue, reset_memory_queue
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sessions.loader import reset_session_stores
from memstore.storage.sql.engine import get_engine
from tests.support.fake_chat import RecordingChatModel


@pytest.fixture
def session_config(tmp_path: Path) -> Iterator[MemoryConfig]:
    config = MemoryConfig(data_dir=str(tmp_path / "data"), session_max_turns=4, extractor="rules")
    set_memory_config(config)
    reset_memory_storage()
    reset_memory_queue()
    reset_session_stores()
    yield config
    reset_memory_queue()
    reset_memory_storage()
    reset_session_stores()


def _history(*texts: str) -> list[dict[str, str]]:
    history: list[dict[str, str]] = []
    for text in texts:
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": f"re: {text}"}]
    return history


def test_after_agent_records_each_exchange_once_and_session_context_reads_it(
    session_config: MemoryConfig,
) -> None:
    set_memory_config(session_config.model_copy(update={"session_max_turns": 6}))
    middleware = MemoryMiddleware("helper", session_memory=True)
    middleware.after_agent(_history("first"), thread_id="t1", user_id="alice")
    middleware.after_agent(_history("first", "second"), thread_id="t1", user_id="alice")
    _, turns = sessions.read_session("alice", "t1", agent_name="helper")
    assert [(turn.role, turn.content) for turn in turns] == [
        ("user", "first"),
        ("assistant", "re: first"),
        ("user", "second"),
        ("assistant", "re: second"),
    ]
    middleware.after_agent(_history("first", "second", "third"), thread_id="t1", user_id="alice")
    get_memory_queue().flush()  # six turns: due, compressed by the queue
    context = middleware.session_context(session_id="t1", user_id="alice")
    assert context.summary is not None and "first" in context.summary
    assert context.messages[0]["role"] == "system" and "<session_summary>" in context.messages[0]["content"]
    # Another user, another agent: nothing.
    assert MemoryMiddleware("helper").session_context(session_id="t1", user_id="bob").messages == []
    assert MemoryMiddleware("other").session_context(session_id="t1", user_id="alice").messages == []


def test_without_the_option_no_session_is_recorded(session_config: MemoryConfig) -> None:
    MemoryMiddleware().after_agent(_history("hello"), thread_id="t1", user_id="alice")
    assert sessions.read_session("alice", "t1") == (None, [])


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_session_store_costs_the_turn_its_session_not_the_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    set_memory_config(
        MemoryConfig(
            data_dir=str(tmp_path / "data"),
            session_backend="redis",
            session_redis_url=SecretStr(f"redis://:sekret@127.0.0.1:{_closed_port()}/0"),
        )
    )
    reset_session_stores()
    middleware = MemoryMiddleware(session_memory=True)
    with caplog.at_level(logging.WARNING):
        middleware.after_agent(_history("hello"), thread_id="t1", user_id="alice")
        context = middleware.session_context(session_id="t1", user_id="alice")
    assert context.messages == [] and context.summary is None
    assert "could not record the session turn" in caplog.text and "could not read the session" in caplog.text
    assert "sekret" not in caplog.text
    reset_session_stores()


def test_the_langchain_middleware_sends_the_session_instead_of_the_threads_history(
    session_config: MemoryConfig,
) -> None:
    model = RecordingChatModel(messages=iter(["Noted one.", "Noted two.", "Noted three."]))
    agent = create_agent(
        model=model,
        tools=[],
        middleware=[LangChainMemoryMiddleware("helper", session_memory=True)],
        checkpointer=InMemorySaver(),
    )
    token = set_current_user("alice")
    try:
        for text in ("I prefer green tea.", "What is the capital of Peru?", "And of Chile?"):
            agent.invoke(
                {"messages": [{"role": "user", "content": text}]},
                config={"configurable": {"thread_id": "thread-1"}},
            )
            get_memory_queue().flush()
    finally:
        reset_current_user(token)
    third: list[Any] = model.received[2]
    texts = [message.text for message in third]
    summary = next(text for text in texts if "<session_summary>" in text)
    assert "I prefer green tea." in summary and "Noted two." in summary
    # The thread's four earlier messages are not sent again beside their summary.
    assert not any(text == "What is the capital of Peru?" for text in texts)
    assert texts[-1] == "And of Chile?"


def test_the_lifecycle_run_deletes_expired_sessions(session_config: MemoryConfig) -> None:
    sessions.append_turns("alice", "old", _history("hello"))
    sessions.append_turns("bob", "old", _history("hello"), tenant_id="acme")
    later = datetime.now(UTC) + timedelta(seconds=session_config.session_ttl_seconds + 60)
    assert run_lifecycle(dry_run=True, now=later).sessions_expired == 0
    assert run_lifecycle(dry_run=False, now=later, threshold=0.01, user_id="alice").sessions_expired == 0
    report = run_lifecycle(dry_run=False, now=later, threshold=0.01)
    assert report.sessions_expired == 2
    engine = get_engine(f"sqlite:///{Path(session_config.data_dir) / 'memory.db'}")
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT (SELECT count(*) FROM memory_sessions), (SELECT count(*) FROM memory_session_turns)"
        ).one()
    assert tuple(rows) == (0, 0)


def test_a_run_without_a_new_user_message_records_only_what_is_new(session_config: MemoryConfig) -> None:
    set_memory_config(session_config.model_copy(update={"session_max_turns": 20}))
    middleware = MemoryMiddleware(session_memory=True)
    history = _history("first")
    middleware.after_agent(history, thread_id="t1", user_id="alice")
    middleware.after_agent(history, thread_id="t1", user_id="alice")  # the same run, handed twice
    reminder = [*history, {"role": "assistant", "content": "A reminder."}]
    middleware.after_agent(reminder, thread_id="t1", user_id="alice")
    _, turns = sessions.read_session("alice", "t1")
    assert [(turn.role, turn.content) for turn in turns] == [
        ("user", "first"),
        ("assistant", "re: first"),
        ("assistant", "A reminder."),
    ]


def test_the_process_store_lets_go_of_expired_sessions(tmp_path: Path) -> None:
    from memstore.session import SessionKey, SessionLimits, SessionTurn
    from memstore.storage.sessions.memory import InMemorySessionStore

    store = InMemorySessionStore()
    limits = SessionLimits(max_stored_turns=10, max_sessions_per_user=100, ttl_seconds=60)
    start = datetime(2026, 11, 27, tzinfo=UTC)
    for number in range(5):
        store.append(SessionKey("u", f"s{number}"), [SessionTurn("user", "x")], now=start, limits=limits)
    later = start + timedelta(hours=2)
    store.append(SessionKey("u", "late"), [SessionTurn("user", "x")], now=later, limits=limits)
    # The append swept the five expired sessions: nothing is left for expire() to find.
    assert store.expire(later) == 0
