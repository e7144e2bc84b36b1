"""Erasure, clearing, vacuum and the audit trail on SQLite and PostgreSQL.

The erase tests look at every table (SQLite's FTS shadow tables included) for any trace of
the erased user, and run a queued update through the real queue, updater and openai client
to show a late write cannot bring the user back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import inspect, text

from memstore.capture.conversation import ConversationContext
from memstore.config import SQL_STORAGE_CLASS, MemoryConfig, set_memory_config
from memstore.document import MemoryDocument, create_empty_memory
from memstore.errors import InvalidScopeError, StaleDocumentError
from memstore.gateway.middleware import MemoryMiddleware
from memstore.integrations.fastapi import create_memory_router
from memstore.ops.facts import (
    clear_memory_data,
    create_memory_fact,
    import_memory_data,
    update_memory_fact,
)
from memstore.queries import FactFilter, erase_user, memory_history, vacuum
from memstore.queue import get_memory_queue, reset_memory_queue
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from tests.support.openai_server import OpenAIStubServer

SECRET = "zebra-orchid-4711"  # appears only in alice's memory


def _reply(content: str) -> str:
    update = {"user": {}, "history": {}, "newFacts": [{"content": content, "confidence": 0.9}]}
    return json.dumps(update)


def _configure(url: str, tmp_path: Path, llm_base_url: str) -> Iterator[MemoryConfig]:
    config = MemoryConfig(
        data_dir=str(tmp_path / "data"),
        storage_class=SQL_STORAGE_CLASS,
        database_url=url,
        llm_base_url=llm_base_url,
        llm_api_key=SecretStr("test-key"),
        model_name="test-model",
        debounce_seconds=30,
    )
    set_memory_config(config)
    reset_memory_storage()
    reset_memory_queue()
    yield config
    reset_memory_queue()
    reset_memory_storage()


@pytest.fixture
def config(sql_url: str, tmp_path: Path, openai_server: OpenAIStubServer) -> Iterator[MemoryConfig]:
    yield from _configure(sql_url, tmp_path, openai_server.base_url)


@pytest.fixture
def sqlite_config(sqlite_url: str, tmp_path: Path, openai_server: OpenAIStubServer) -> Iterator[MemoryConfig]:
    yield from _configure(sqlite_url, tmp_path, openai_server.base_url)


def _seed(storage: SqlMemoryStorage) -> None:
    for user, agent in (("alice", None), ("alice", "coder"), ("bob", None)):
        document = create_empty_memory()
        marker = SECRET if user == "alice" else "bob-marker"
        document["user"]["workContext"]["summary"] = f"{user} works with {marker}"
        document["facts"] = [
            {"id": f"{user}-{agent}-{i}", "content": f"{user} fact {i} {marker}", "category": "context"}
            for i in range(3)
        ]
        assert storage.save(document, agent, user_id=user, origin="seed")
    # An update and a delete, so history holds before/after values and facts hold tombstones.
    document = storage.load(user_id="alice")
    document["facts"][0]["content"] = f"alice changed {SECRET}"
    document["facts"].pop()
    assert storage.save(document, user_id="alice", origin="edit")


def _rows_mentioning(url: str, needles: tuple[str, ...]) -> dict[str, int]:
    """Rows per table whose any column (text, JSON or bytes) contains one of ``needles``."""
    engine = get_engine(url)
    found: dict[str, int] = {}
    with engine.connect() as conn:
        names = inspect(conn).get_table_names()
        if engine.dialect.name == "sqlite":
            names = [
                row[0] for row in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='table'")
            ]
        for name in names:
            for row in conn.execute(text(f'SELECT * FROM "{name}"')):
                cells = [
                    c.decode("utf-8", "replace") if isinstance(c, bytes) else json.dumps(c, default=str)
                    for c in row
                ]
                if any(needle in cell for cell in cells for needle in needles):
                    found[name] = found.get(name, 0) + 1
    return found


def test_erase_removes_every_row_of_the_user_and_keeps_others(config: MemoryConfig, sql_url: str) -> None:
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    _seed(storage)
    before = _rows_mentioning(sql_url, ("alice", SECRET))
    assert before.get("memory_facts") and before.get("memory_history") and before.get("memory_scopes")

    counts = erase_user("alice", storage=storage)

    assert counts["memory_scopes"] == 2
    assert counts["memory_facts"] == 6  # 5 live + 1 tombstone
    assert counts["memory_sections"] == 2
    assert counts["memory_history"] == before["memory_history"]
    assert _rows_mentioning(sql_url, ("alice", SECRET)) == {}
    bob = storage.reload(user_id="bob")
    assert [f["id"] for f in bob["facts"]] == ["bob-None-0", "bob-None-1", "bob-None-2"]
    assert storage.load(user_id="alice")["facts"] == []


def test_erased_text_is_gone_from_the_sqlite_file(sqlite_config: MemoryConfig, sqlite_url: str) -> None:
    """secure_delete and an FTS merge leave no copy in free pages or old index segments."""
    sql_url = sqlite_url
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    _seed(storage)
    for user in ("alice", "bob"):  # interleaved pages, so freed space sits next to live rows
        document = storage.load(agent_name="notes", user_id=user)
        marker = SECRET if user == "alice" else "bob-marker"
        document["facts"] = [{"id": f"n{i}", "content": f"note {i} {marker} " * 5} for i in range(200)]
        assert storage.save(document, "notes", user_id=user)
    erase_user("alice", storage=storage)
    with get_engine(sql_url).connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    assert SECRET.encode() not in Path(sql_url.removeprefix("sqlite:///")).read_bytes()


def test_erase_deletes_the_users_queued_conversations(
    config: MemoryConfig, sql_url: str, openai_server: OpenAIStubServer
) -> None:
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    _seed(storage)
    openai_server.default_reply = _reply(f"alice loves {SECRET}")
    middleware = MemoryMiddleware()
    thread = [{"role": "user", "content": f"I love {SECRET}"}, {"role": "assistant", "content": "Noted."}]
    middleware.after_agent(thread, thread_id="t-late", user_id="alice")
    assert get_memory_queue().pending_count == 1

    counts = erase_user("alice", storage=storage)
    get_memory_queue().flush()

    assert counts["memory_queue"] == 1
    assert openai_server.requests == []  # nothing of hers was left to run
    assert _rows_mentioning(sql_url, ("alice", SECRET)) == {}


def test_a_queued_update_processed_after_erase_does_not_recreate_the_user(
    config: MemoryConfig, sql_url: str, openai_server: OpenAIStubServer
) -> None:
    """The in-process queue (which erase cannot reach) is held off by the store's fence."""
    set_memory_config(config.model_copy(update={"queue_backend": "memory"}))
    reset_memory_queue()
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    _seed(storage)
    openai_server.default_reply = _reply(f"alice loves {SECRET}")
    middleware = MemoryMiddleware()
    thread = [{"role": "user", "content": f"I love {SECRET}"}, {"role": "assistant", "content": "Noted."}]
    middleware.after_agent(thread, thread_id="t-late", user_id="alice")
    assert get_memory_queue().pending_count == 1

    erase_user("alice", storage=storage)
    get_memory_queue().flush()

    assert len(openai_server.requests) == 1  # the update ran; its save was refused
    assert _rows_mentioning(sql_url, ("alice", SECRET)) == {}

    # A conversation captured after the erase is new memory and is kept.
    openai_server.default_reply = _reply("alice starts over")
    middleware.after_agent(thread, thread_id="t-new", user_id="alice")
    get_memory_queue().flush()
    assert [f["content"] for f in storage.reload(user_id="alice")["facts"]] == ["alice starts over"]


def test_an_in_flight_update_loaded_before_erase_is_dropped(config: MemoryConfig, sql_url: str) -> None:
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    _seed(storage)
    in_flight = storage.load(user_id="alice")
    erase_user("alice", storage=SqlMemoryStorage(sql_url))  # another process
    in_flight["facts"].append({"id": "new", "content": f"late {SECRET}", "category": "context"})
    with pytest.raises(StaleDocumentError):  # dropped and logged, never reported as saved
        storage.save(in_flight, user_id="alice")
    assert _rows_mentioning(sql_url, ("alice", SECRET)) == {}


def test_clear_fences_updates_captured_before_it(config: MemoryConfig) -> None:
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    _seed(storage)
    captured = datetime.now(UTC)
    clear_memory_data(user_id="alice")
    stale = create_empty_memory()
    stale["facts"] = [{"id": "x", "content": "from before the clear", "category": "context"}]
    with pytest.raises(StaleDocumentError):
        storage.save(stale, user_id="alice", captured_at=captured)
    assert storage.reload(user_id="alice")["facts"] == []
    assert storage.save(stale, user_id="alice", captured_at=datetime.now(UTC))
    assert [f["id"] for f in storage.reload(user_id="alice")["facts"]] == ["x"]


def test_history_records_origin_before_and_after(config: MemoryConfig) -> None:
    created = create_memory_fact("Alice uses Postgres", user_id="alice")
    fact_id = created["facts"][0]["id"]
    update_memory_fact(fact_id, content="Alice uses SQLite", user_id="alice")
    import_memory_data(
        create_empty_memory() | {"facts": [{"id": "i1", "content": "imported"}]}, user_id="alice"
    )
    clear_memory_data(user_id="alice")

    entries = memory_history(FactFilter(user_id="alice"))
    fact_rows = [(e.entity_id, e.action, e.origin) for e in entries if e.entity == "fact"]
    assert fact_rows == [
        (fact_id, "insert", "manual"),
        (fact_id, "update", "manual"),
        (fact_id, "delete", "import"),
        ("i1", "insert", "import"),
        ("i1", "delete", "erase"),
    ]
    update = next(e for e in entries if e.action == "update")
    assert update.before is not None and update.after is not None
    assert (update.before["content"], update.after["content"]) == ("Alice uses Postgres", "Alice uses SQLite")
    assert all(e.user_id == "alice" and e.changed_at.tzinfo is not None for e in entries)
    assert [e.entity_id for e in memory_history(FactFilter(user_id="alice"), fact_id="i1")] == ["i1", "i1"]
    revisions = [e.revision for e in entries]
    assert revisions == sorted(revisions)


def test_vacuum_purges_old_history_and_tombstones_and_fences_older_documents(
    config: MemoryConfig, sql_url: str
) -> None:
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    _seed(storage)
    stale = storage.load(user_id="alice")  # holds fact 1 and 2; fact 2's delete comes next
    current = storage.load(user_id="alice")
    current["facts"].pop()
    assert storage.save(current, user_id="alice")

    assert vacuum(timedelta(days=1), storage=storage) == {
        "memory_facts": 0,
        "memory_history": 0,
        "memory_erasures": 0,
    }
    purged = vacuum(timedelta(0), storage=storage)
    assert purged["memory_facts"] == 2  # the two tombstones
    assert purged["memory_history"] > 0
    with get_engine(sql_url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM memory_history")).scalar_one() == 0
        assert (
            conn.execute(
                text("SELECT count(*) FROM memory_facts WHERE deleted_revision IS NOT NULL")
            ).scalar_one()
            == 0
        )

    live = [f["id"] for f in storage.reload(user_id="alice")["facts"]]
    assert len(live) == 1
    # The stale document still holds the purged fact: merging it would resurrect it.
    with pytest.raises(StaleDocumentError):
        storage.save(stale, user_id="alice")
    assert [f["id"] for f in storage.reload(user_id="alice")["facts"]] == live
    # A document loaded now merges normally.
    fresh = storage.load(user_id="alice")
    fresh["facts"].append({"id": "after", "content": "after vacuum", "category": "context"})
    assert storage.save(fresh, user_id="alice")
    assert [f["id"] for f in storage.reload(user_id="alice")["facts"]] == [*live, "after"]


def test_erase_and_vacuum_refuse_bad_input(config: MemoryConfig) -> None:
    from memstore.errors import InvalidScopeError, QueryError

    with pytest.raises(InvalidScopeError):
        erase_user("alice'; DROP TABLE memory_scopes; --")
    with pytest.raises(QueryError):
        vacuum(timedelta(days=-1))


def _add_two_facts(storage: SqlMemoryStorage, user_id: str, prefix: str) -> None:
    """Two saves, so a scope (re-)created from nothing is at revision 2."""
    for n in (1, 2):
        document = storage.load(user_id=user_id)
        document["facts"].append({"id": f"{prefix}-{n}", "content": f"{prefix} {n}", "category": "context"})
        assert storage.save(document, user_id=user_id, origin="manual")


def test_a_document_loaded_before_erase_is_refused_at_the_same_revision(
    config: MemoryConfig, sql_url: str
) -> None:
    """The issue's sequence: load at revision 2, erase, two new facts (revision 2 again), save."""
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    _add_two_facts(storage, "alice", SECRET)
    loaded = storage.load(user_id="alice")  # what a PATCH holds while the erase runs
    assert loaded["revision"] == 2
    erase_user("alice", storage=SqlMemoryStorage(sql_url))  # another process
    _add_two_facts(storage, "alice", "after")
    assert storage.reload(user_id="alice")["revision"] == 2

    loaded["facts"][0]["content"] = f"edited {SECRET}"
    with pytest.raises(StaleDocumentError):
        storage.save(loaded, user_id="alice", origin="manual")

    assert [f["content"] for f in storage.reload(user_id="alice")["facts"]] == ["after 1", "after 2"]
    assert _rows_mentioning(sql_url, (SECRET,)) == {}


def test_a_refused_late_update_counts_as_skipped_not_updated(
    config: MemoryConfig, sql_url: str, openai_server: OpenAIStubServer
) -> None:
    """A turn captured before the erase that reaches the database queue only after it (it sat
    in a process's outage buffer) runs, and the store's fence refuses its save."""
    # flush alone runs it: a background worker could still hold the scope's claim (which names
    # the user) for a moment after the row is gone, when the check below looks.
    set_memory_config(config.model_copy(update={"queue_workers": 0}))
    reset_memory_queue()
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    _seed(storage)
    openai_server.default_reply = _reply(f"alice loves {SECRET}")
    thread = [{"role": "user", "content": f"I love {SECRET}"}, {"role": "assistant", "content": "Noted."}]
    captured = ConversationContext("t-late", thread, None, "alice")
    erase_user("alice", storage=storage)
    queue = get_memory_queue()
    queue.submit(captured, immediately=True)
    queue.flush()

    assert len(openai_server.requests) == 1
    assert (queue.stats.updated, queue.stats.skipped) == (0, 1)
    assert _rows_mentioning(sql_url, ("alice", SECRET)) == {}, "the refused row is deleted, not kept as done"


class ErasedWhileEditing(SqlMemoryStorage):
    """The configured storage, with another process erasing alice (and her adding two facts)
    between the next ``load`` and the save that follows it."""

    armed = False

    def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        document = super().load(agent_name, user_id=user_id)
        if ErasedWhileEditing.armed and user_id == "alice":
            ErasedWhileEditing.armed = False
            other = SqlMemoryStorage(self._url)
            erase_user("alice", storage=other)
            _add_two_facts(other, "alice", "after")
        return document


def test_a_patch_that_raced_an_erase_answers_409_and_stores_nothing(sql_url: str, tmp_path: Path) -> None:
    set_memory_config(
        MemoryConfig(
            data_dir=str(tmp_path / "data"),
            storage_class=f"{__name__}.ErasedWhileEditing",
            database_url=sql_url,
        )
    )
    reset_memory_storage()
    app = FastAPI()
    app.include_router(create_memory_router(lambda: "alice"))
    with TestClient(app) as client:
        for text in (f"one {SECRET}", f"two {SECRET}"):
            assert client.post("/api/memory/facts", json={"content": text}).status_code == 200
        fact_id = client.get("/api/memory").json()["facts"][0]["id"]
        ErasedWhileEditing.armed = True
        response = client.patch(f"/api/memory/facts/{fact_id}", json={"content": f"edited {SECRET}"})
        assert response.status_code == 409, response.text
        assert [f["content"] for f in client.get("/api/memory").json()["facts"]] == ["after 1", "after 2"]
    reset_memory_storage()
    assert _rows_mentioning(sql_url, (SECRET,)) == {}


def test_an_empty_user_id_erases_and_lists_nothing_of_the_memory_without_a_user(sql_url: str) -> None:
    """COALESCE(user_id, '') = '' would match the global and agent-only scopes: '' is refused."""
    storage = SqlMemoryStorage(sql_url)
    document = {"facts": [{"id": "g", "content": "shared fact", "category": "context", "confidence": 0.9}]}
    assert storage.save(document) and storage.save(document, "coder")
    for call in (lambda: storage.erase_user(""), lambda: storage.list_scopes("")):
        with pytest.raises(InvalidScopeError):
            call()
    assert [fact["id"] for fact in storage.reload()["facts"]] == ["g"]
    assert [fact["id"] for fact in storage.reload("coder")["facts"]] == ["g"]
