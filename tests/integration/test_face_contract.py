"""The request path's contract, once on the sync face and once on the async face, on SQLite and
PostgreSQL (``face`` x ``sql_url``): one suite, so the two faces cannot drift apart.

The async face runs the same core on the event loop with the async drivers (aiosqlite, psycopg's
async connection); each test here would fail on it if the core took another path there: other
results, other errors, another identity or a lost write.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import (
    ConfigError,
    DuplicateFactError,
    FactNotFoundError,
    InvalidFactError,
    InvalidScopeError,
    QueryError,
    SchemaNotReadyError,
)
from memstore.gateway.middleware import MemoryMiddleware
from memstore.queries import FactFilter
from memstore.queue import get_memory_queue, reset_memory_queue
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.schema.migrate import upgrade
from tests.support.faces import AsyncFace, Face
from tests.support.openai_server import OpenAIStubServer
from tests.support.semantic import MODEL

TURN = [
    {"role": "user", "content": "I moved to Lisbon last spring"},
    {"role": "assistant", "content": "Noted."},
]


@pytest.fixture
def memory(sql_url: str, tmp_path: Path) -> Iterator[MemoryConfig]:
    config = MemoryConfig(data_dir=str(tmp_path / "data"), database_url=sql_url)
    set_memory_config(config)
    reset_memory_storage()
    reset_memory_queue()
    get_memory_storage()  # the schema: embedded SQLite migrates on first use
    yield config
    reset_memory_queue()
    reset_memory_storage()


def test_memory_context_shows_the_callers_own_facts_only(face: Face, memory: MemoryConfig) -> None:
    face.call("create_memory_fact", "Alice drinks green tea", user_id="alice")
    face.call("create_memory_fact", "Bob plays the cello", user_id="bob")
    face.call("create_memory_fact", "Alice of acme rides a bike", user_id="alice", tenant_id="acme")
    middleware = MemoryMiddleware()

    alice = face.memory_context(middleware, user_id="alice")
    assert "Alice drinks green tea" in alice
    assert "cello" not in alice and "bike" not in alice
    acme = face.memory_context(middleware, user_id="alice", tenant_id="acme")
    assert "bike" in acme and "green tea" not in acme
    assert face.memory_context(middleware, user_id="carol") == ""


def test_shared_facts_reach_the_tenant_and_no_further(face: Face, memory: MemoryConfig) -> None:
    face.call(
        "create_memory_fact",
        "The office closes at six",
        user_id="alice",
        tenant_id="acme",
        roles=["editor"],
        visibility="public",
    )
    middleware = MemoryMiddleware()
    assert "closes at six" in face.memory_context(middleware, user_id="bob", tenant_id="acme")
    assert "closes at six" not in face.memory_context(middleware, user_id="bob", tenant_id="globex")


def test_fact_helpers_raise_the_same_domain_errors(face: Face, memory: MemoryConfig) -> None:
    document = face.call("create_memory_fact", "Prefers short answers", user_id="alice")
    fact_id = document["facts"][0]["id"]
    with pytest.raises(DuplicateFactError):
        face.call("create_memory_fact", "Prefers short answers", user_id="alice")
    with pytest.raises(FactNotFoundError):
        face.call("update_memory_fact", "fact_missing", content="x", user_id="alice")
    with pytest.raises(FactNotFoundError):  # another user's fact is not found, not changed
        face.call("delete_memory_fact", fact_id, user_id="bob")
    with pytest.raises(InvalidScopeError):
        face.call("create_memory_fact", "x", user_id="../alice")
    with pytest.raises(InvalidFactError):
        face.call("create_memory_fact", "x" * 100_000, user_id="alice")
    with pytest.raises(QueryError):
        face.query("list_facts", limit=0)
    stored = face.call("get_memory_data", user_id="alice")
    assert [fact["content"] for fact in stored["facts"]] == ["Prefers short answers"]


def test_a_fact_round_trips_through_update_and_delete(face: Face, memory: MemoryConfig) -> None:
    created = face.call("create_memory_fact", "Lives in Porto", "context", 0.8, user_id="alice")
    fact_id = created["facts"][0]["id"]
    updated = face.call("update_memory_fact", fact_id, content="Lives in Lisbon", user_id="alice")
    assert [fact["content"] for fact in updated["facts"]] == ["Lives in Lisbon"]
    face.call("delete_memory_fact", fact_id, user_id="alice")
    assert face.call("get_memory_data", user_id="alice")["facts"] == []
    history = face.query("memory_history", FactFilter(user_id="alice"), fact_id=fact_id)
    assert [entry.action for entry in history] == ["insert", "update", "delete"]


def test_queries_answer_alike(face: Face, memory: MemoryConfig) -> None:
    for index, user in enumerate(["alice", "bob", "alice"]):
        face.call("create_memory_fact", f"note {index} about the harbour", "goal", user_id=user)
    page = face.query("list_facts", FactFilter(user_id="alice"), limit=10)
    assert page.total == 2
    assert {record.content for record in page.facts} == {
        "note 0 about the harbour",
        "note 2 about the harbour",
    }
    hits = face.query("search_facts", "harbour", FactFilter(user_id="bob"))
    assert [record.content for record in hits.facts] == ["note 1 about the harbour"]
    assert face.query("count_facts", FactFilter(category="goal")) == 3
    assert face.query("count_facts", FactFilter(category="goal"), tenant_id="acme") == 0
    assert {scope[0] for scope in face.query("list_scopes")} == {"alice", "bob"}


def test_after_agent_queues_the_turn_and_records_the_session(face: Face, memory: MemoryConfig) -> None:
    middleware = MemoryMiddleware("bot", session_memory=True)
    face.after_agent(middleware, TURN, thread_id="thread-1", user_id="alice", tenant_id="acme")
    assert get_memory_queue().pending_count == 1
    info, turns = face.call("read_session", "alice", "thread-1", agent_name="bot", tenant_id="acme")
    assert info is not None
    assert [(turn.role, turn.content) for turn in turns] == [(m["role"], m["content"]) for m in TURN]
    context = face.session_context(middleware, session_id="thread-1", user_id="alice", tenant_id="acme")
    assert [message["content"] for message in context.messages] == [m["content"] for m in TURN]
    # Another tenant's session of the same name is another session.
    other = face.session_context(middleware, session_id="thread-1", user_id="alice", tenant_id="globex")
    assert other.messages == []


def test_an_invalid_identity_costs_the_turn_not_the_request(
    face: Face, memory: MemoryConfig, caplog: pytest.LogCaptureFixture
) -> None:
    middleware = MemoryMiddleware()
    with caplog.at_level(logging.ERROR):
        face.after_agent(middleware, TURN, thread_id="t", user_id="bad user!")
    assert get_memory_queue().pending_count == 0
    assert "InvalidScopeError" in caplog.text
    assert "bad user" not in caplog.text  # the id is the caller's data: the class only
    with pytest.raises(InvalidScopeError):
        face.read_memory_context(middleware, user_id="alice", tenant_id="no such tenant")


@pytest.mark.postgres
def test_a_schema_behind_head_is_raised_not_swallowed(face: Face, pg_url: str, tmp_path: Path) -> None:
    upgrade(pg_url, "0010")
    set_memory_config(MemoryConfig(data_dir=str(tmp_path / "data"), database_url=pg_url, auto_migrate=False))
    reset_memory_storage()
    try:
        with pytest.raises(SchemaNotReadyError):
            face.memory_context(MemoryMiddleware(), user_id="alice")
    finally:
        reset_memory_storage()
        dispose_engines()


def test_relevance_ranking_embeds_through_the_endpoint_alike(
    face: Face, memory: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    memory.embedding_model = MODEL
    memory.embedding_base_url = openai_server.base_url
    memory.embedding_provider = "openai"
    reset_memory_storage()
    filler = " ".join(f"word{index}" for index in range(30))
    for content in ["Plays the piano every evening", "Allergic to peanuts", "Works as a nurse at night"]:
        face.call("create_memory_fact", f"{content} {filler}", user_id="alice")
    memory.max_injection_tokens = 100  # room for about one of them: the relevant one must win
    block = face.memory_context(MemoryMiddleware(), user_id="alice", query="peanuts in the food?")
    assert "peanuts" in block
    assert "piano" not in block and "nurse" not in block
    embedded = [request["input"] for request in openai_server.embedding_requests]
    assert ["peanuts in the food?"] in embedded, "the query was embedded through the endpoint"


def test_an_in_memory_sqlite_database_is_refused_on_the_async_face(tmp_path: Path) -> None:
    set_memory_config(MemoryConfig(data_dir=str(tmp_path / "data"), database_url="sqlite:///:memory:"))
    reset_memory_storage()
    face = AsyncFace()
    try:
        with pytest.raises(ConfigError, match="in-memory SQLite"):
            face.call("get_memory_data", user_id="alice")
    finally:
        face.close()
        reset_memory_storage()
