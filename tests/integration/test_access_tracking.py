"""Access tracking on the SQL provider: counts kept in memory, written in batches, never content.

Real SQLite files and real PostgreSQL. The clock that decides when an interval has passed is
``memstore.storage.sql.documents.access.monotonic``; tests that cross an interval replace it with a
counter they advance by hand, so nothing here waits or times anything.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from langchain.agents import create_agent
from sqlalchemy import Engine, text

from memstore.config import MemoryConfig
from memstore.gateway.middleware import MemoryMiddleware
from memstore.gateway.tools import memory_search
from memstore.integrations.fastapi import create_memory_router
from memstore.integrations.langchain import LangChainMemoryMiddleware
from memstore.ops.facts import search_memory_facts
from memstore.queries import FactFilter, list_facts, search_facts
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.documents import access as access_module
from memstore.storage.sql.engine import get_engine
from tests.support.fake_chat import RecordingChatModel
from tests.support.semantic import doc, fact
from tests.support.statements import sent_statements


def _fact(index: int, content: str | None = None, confidence: float = 0.8) -> dict[str, Any]:
    text = content if content is not None else f"remembered item {index:03d}"
    return {**fact(f"fact_{index:08x}", text, confidence), "createdAt": "2026-07-14T15:35:46.123456Z"}


def _fact_writes(statements: list[tuple[str, int]]) -> int:
    """Rows-worth of writes to memory_facts: one per parameter set of an UPDATE/INSERT on it."""
    return sum(
        count
        for statement, count in statements
        if statement.startswith(("UPDATE memory_facts", "INSERT INTO memory_facts"))
    )


def _writes(statements: list[tuple[str, int]]) -> list[str]:
    return [s for s, _ in statements if s.split(" ", 1)[0] in ("UPDATE", "INSERT", "DELETE")]


def _counts(engine: Engine, user_id: str, agent_name: str | None = None) -> dict[str, int]:
    """access_count of every row of the scope, tombstones included."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT f.fact_id, f.access_count FROM memory_facts f JOIN memory_scopes s"
                " ON s.id = f.scope_id WHERE s.user_id = :u AND COALESCE(s.agent_name, '') = :a"
            ),
            {"u": user_id, "a": agent_name or ""},
        ).all()
    return {row[0]: row[1] for row in rows}


def _scope_state(engine: Engine, user_id: str) -> tuple[Any, ...]:
    with engine.connect() as conn:
        revision, updated = conn.execute(
            text("SELECT revision, updated_at FROM memory_scopes WHERE user_id = :u"), {"u": user_id}
        ).one()
        history = conn.execute(text("SELECT count(*) FROM memory_history")).scalar_one()
    return revision, str(updated), history


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The recorder's monotonic clock, advanced by the test: request it before any storage fixture."""
    now = [1_000.0]
    monkeypatch.setattr(access_module, "monotonic", lambda: now[0])
    return now


# --- the provider: what a flush writes, and what it leaves alone ------------------------------------


def test_a_flush_writes_counts_without_touching_revision_history_or_cache(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(doc(_fact(1), _fact(2), _fact(3)), user_id="alice")
    revision = storage.load(user_id="alice")["revision"]
    engine = get_engine(sql_url)
    before = _scope_state(engine, "alice")

    with sent_statements(engine) as seen:
        storage.record_access(None, user_id="alice", fact_ids=["fact_00000001", "fact_00000002"])
        storage.record_access(None, user_id="alice", fact_ids=["fact_00000001"])
    assert seen == []  # recording is memory only
    assert _counts(engine, "alice") == dict.fromkeys(("fact_00000001", "fact_00000002", "fact_00000003"), 0)

    with sent_statements(engine) as seen:
        assert storage.flush_access() == 2
    assert [s for s in _writes(seen) if not s.startswith("UPDATE memory_facts")] == []
    signals = storage.fact_signals(user_id="alice")
    assert {fact_id: s.access_count for fact_id, s in signals.items()} == {
        "fact_00000001": 2,
        "fact_00000002": 1,
        "fact_00000003": 0,
    }
    accessed = signals["fact_00000001"].last_accessed_at
    assert accessed is not None and accessed.tzinfo is not None and accessed.utcoffset() == timedelta(0)
    assert signals["fact_00000003"].last_accessed_at is None
    assert _scope_state(engine, "alice") == before  # no revision bump, no audit row

    with sent_statements(engine) as seen:
        loaded = storage.load(user_id="alice")
    assert loaded["revision"] == revision
    # Served from the cache: one stamp query, no read of the fact rows.
    reads = [statement for statement, _ in seen if statement.startswith("SELECT")]
    assert len(reads) == 1 and "memory_facts" not in reads[0]
    assert storage.flush_access() == 0  # nothing pending any more


def test_tombstoned_facts_are_skipped_and_scopes_never_touch_each_other(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    for user in ("alice", "bob"):
        assert storage.save(doc(_fact(1), _fact(2)), user_id=user)
    assert storage.save(doc(_fact(1), _fact(2)), "coder", user_id="alice")
    storage.record_access(None, user_id="alice", fact_ids=["fact_00000001", "fact_00000002"])
    assert storage.save(doc(_fact(1)), user_id="alice")  # fact 2 tombstoned before the flush
    assert storage.flush_access() == 2
    engine = get_engine(sql_url)
    assert _counts(engine, "alice") == {"fact_00000001": 1, "fact_00000002": 0}
    assert _counts(engine, "alice", "coder") == {"fact_00000001": 0, "fact_00000002": 0}
    assert _counts(engine, "bob") == {"fact_00000001": 0, "fact_00000002": 0}
    assert set(storage.fact_signals(user_id="alice")) == {"fact_00000001"}


def test_tracking_switched_off_records_nothing(sql_url: str, isolated_config: MemoryConfig) -> None:
    isolated_config.access_tracking = False
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(doc(_fact(1)), user_id="alice")
    storage.record_access(None, user_id="alice", fact_ids=["fact_00000001"])
    assert storage.flush_access() == 0
    assert _counts(get_engine(sql_url), "alice") == {"fact_00000001": 0}


def test_pending_facts_are_capped_with_one_warning(
    sql_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(access_module, "MAX_PENDING", 2)
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(doc(*(_fact(i) for i in range(1, 5))), user_id="alice")
    with caplog.at_level(logging.WARNING, logger=access_module.__name__):
        storage.record_access(None, user_id="alice", fact_ids=["fact_00000001", "fact_00000002"])
        storage.record_access(None, user_id="alice", fact_ids=["fact_00000003", "fact_00000001"])
        storage.record_access(None, user_id="alice", fact_ids=["fact_00000004"])
    assert len(caplog.records) == 1 and "not counted" in caplog.records[0].getMessage()
    assert storage.flush_access() == 2
    # Facts already held kept counting; the ones past the cap were dropped.
    assert _counts(get_engine(sql_url), "alice") == {
        "fact_00000001": 2,
        "fact_00000002": 1,
        "fact_00000003": 0,
        "fact_00000004": 0,
    }


# --- at most one write per fact per interval --------------------------------------------------------


def test_at_most_one_write_per_fact_per_interval(clock: list[float], sql_storage: SqlMemoryStorage) -> None:
    storage = sql_storage
    facts = [_fact(i) for i in range(1, 6)]
    assert storage.save(doc(*facts), user_id="alice")
    engine = storage.engine
    middleware = MemoryMiddleware()

    def busy_interval(rounds: int) -> list[tuple[str, int]]:
        """Many injections and searches, with the flusher's due-only check after each."""
        with sent_statements(engine) as seen:
            for _ in range(rounds):
                assert "remembered item 001" in middleware.memory_context(user_id="alice")
                assert len(search_memory_facts("remembered", limit=10, user_id="alice")) == 5
                assert storage.flush_access(due_only=True) == 0
        return seen

    seen = busy_interval(20)
    assert _writes(seen) == []  # the request path never writes; the interval has not passed
    clock[0] += 299.0
    assert _writes(busy_interval(5)) == []

    clock[0] += 1.0
    with sent_statements(engine) as seen:
        assert storage.flush_access(due_only=True) == 5
    assert _fact_writes(seen) == 5  # one parameter set per fact, in one statement
    assert len([s for s in _writes(seen) if s.startswith("UPDATE memory_facts")]) == 1
    assert set(_counts(engine, "alice").values()) == {50}  # 25 injections + 25 searches each

    seen = busy_interval(3)
    assert _writes(seen) == []  # a new interval started with that flush
    clock[0] += 300.0
    with sent_statements(engine) as seen:
        assert storage.flush_access(due_only=True) == 5
    assert _fact_writes(seen) == 5
    assert set(_counts(engine, "alice").values()) == {56}


# --- call sites: injection and search record exactly what they showed --------------------------------


def test_injection_records_exactly_the_facts_in_the_block(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig
) -> None:
    isolated_config.max_injection_tokens = 100
    facts = [_fact(i, f"the user keeps item number {i:03d} in the attic", 0.9 - i / 100) for i in range(20)]
    assert sql_storage.save(doc(*facts), user_id="alice")
    block = MemoryMiddleware().memory_context(user_id="alice")
    shown = {fact["id"] for fact in facts if fact["content"] in block}
    assert 0 < len(shown) < len(facts)  # the budget cut the list
    assert sql_storage.flush_access() == len(shown)
    counts = _counts(sql_storage.engine, "alice")
    assert {fact_id for fact_id, count in counts.items() if count} == shown
    assert set(counts.values()) == {0, 1}


def test_langchain_agent_records_the_injected_facts(sql_storage: SqlMemoryStorage) -> None:
    assert sql_storage.save(doc(_fact(1, "Alice edits code in Helix")), user_id="alice")
    model = RecordingChatModel(messages=iter(["Helix."]))
    agent = create_agent(model=model, tools=[], middleware=[LangChainMemoryMiddleware()])
    agent.invoke(
        {"messages": [{"role": "user", "content": "Which editor?"}]},
        config={"configurable": {"thread_id": "t-1"}},
        context={"user_id": "alice"},
    )
    assert "Alice edits code in Helix" in model.prompt_text(0)
    assert sql_storage.flush_access() == 1
    assert _counts(sql_storage.engine, "alice") == {"fact_00000001": 1}


def test_searches_record_the_returned_facts_and_listings_do_not(
    sql_storage: SqlMemoryStorage, tmp_path: Path
) -> None:
    facts = [_fact(1, "likes green tea"), _fact(2, "likes black coffee"), _fact(3, "owns a green bike")]
    assert sql_storage.save(doc(*facts), user_id="alice")
    assert sql_storage.save(doc(*facts), user_id="bob")
    engine = sql_storage.engine

    list_facts(FactFilter(user_id="alice"))
    assert sql_storage.flush_access() == 0

    found = search_memory_facts("green", user_id="alice")
    assert {fact["id"] for fact in found} == {"fact_00000001", "fact_00000003"}
    assert sql_storage.flush_access() == 2
    assert _counts(engine, "alice") == {"fact_00000001": 1, "fact_00000002": 0, "fact_00000003": 1}

    assert '"count": 1' in memory_search("coffee", user_id="alice")
    app = FastAPI()
    app.include_router(create_memory_router(lambda: "alice"))
    with TestClient(app) as client:
        response = client.get("/api/memory/facts", params={"q": "coffee"})
    assert response.status_code == 200 and [f["id"] for f in response.json()] == ["fact_00000002"]
    assert sql_storage.flush_access() == 1
    assert _counts(engine, "alice")["fact_00000002"] == 2

    # An operator's cross-scope search (`memstore facts search`) is no use of anyone's memory.
    page = search_facts("tea")
    hits = {(f.user_id, f.fact_id) for f in page.facts}
    assert hits == {("alice", "fact_00000001"), ("bob", "fact_00000001")}
    assert sql_storage.flush_access() == 0
    assert _counts(engine, "alice")["fact_00000001"] == 1
    assert _counts(engine, "bob") == {"fact_00000001": 0, "fact_00000002": 0, "fact_00000003": 0}


def test_ids_that_cannot_name_a_fact_are_not_counted_and_cannot_poison_a_flush(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(doc(_fact(1, "likes green tea")), user_id="alice")
    bad: list[Any] = ["fact_\ud800", "fact_\x00nul", 42, "", "f" * 65, None]
    storage.record_access(None, user_id="alice", fact_ids=[*bad, "fact_00000001"])
    assert storage.flush_access() == 1
    assert _counts(storage.engine, "alice") == {"fact_00000001": 1}
    storage.record_access(None, user_id="alice", fact_ids=["fact_00000001"])
    assert storage.flush_access() == 1  # the recorder still works
    assert _counts(storage.engine, "alice") == {"fact_00000001": 2}
    storage.close()
