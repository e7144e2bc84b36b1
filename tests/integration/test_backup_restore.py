"""``memstore backup`` / ``restore`` (issue 30, item 14) through the real CLI, on both dialects.

A round trip must keep every row of every memory table as it was (ids, revisions, lastUpdated,
tombstones, retention signals, vectors with their model, audit history, erasures), which
``export``/``import`` cannot: they re-save documents. The comparison reads the tables directly,
independently of the backup's own encoding.
"""

from __future__ import annotations

import gzip
import json
import os
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import JSON, insert, select, text, update

from memstore.agent_doc import MAIN_DOC_PATH, DocLimits, DocScope
from memstore.ops.backup import backup_database, restore_database
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.agent_docs.store import AgentDocStore
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.maintenance.erase import erase_user
from memstore.storage.sql.schema.models import (
    agent_document_versions_table,
    agent_documents_table,
    embeddings_table,
    erasures_table,
    facts_table,
    grants_table,
    history_table,
    queue_table,
    relations_table,
    scopes_table,
    sections_table,
    store_item_history_table,
    store_items_table,
    tags_table,
)
from memstore.storage.sql.store_items.items import ItemScope, ItemWrite
from memstore.storage.sql.store_items.store import ItemStore
from tests.integration.conftest import Cli

TABLES = (
    scopes_table,
    sections_table,
    facts_table,
    grants_table,
    tags_table,
    relations_table,
    embeddings_table,
    history_table,
    erasures_table,
    agent_documents_table,
    agent_document_versions_table,
    store_items_table,
    store_item_history_table,
)
MODEL = "openai:text-embedding-3-small@3"
SIGNALS_AT = datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=UTC)


def _cli(tmp_path: Path) -> Cli:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_DATA_DIR"] = str(tmp_path / "cli-data")
    return Cli(env, "")


def _populate(url: str) -> None:
    """Every kind of row the memory tables hold, including the ones a re-save would lose."""
    storage = SqlMemoryStorage(url)
    section = {"summary": "Alice runs deer-flow 部署", "updatedAt": "2026-01-05T08:00:00Z", "note": "kept"}
    storage.save(
        {
            "user": {"workContext": section},
            "history": {"recentMonths": {"summary": "moved to Lisbon", "updatedAt": "not a date"}},
            "facts": [
                {
                    "id": "a1",
                    "content": "Alice likes green tea 绿茶",
                    "category": "preference",
                    "confidence": 0.9,
                    "createdAt": "2026-01-02T03:04:05.678901Z",
                    "source": "t-1",
                },
                {
                    "id": "a2",
                    "content": "Alice uses vim",
                    "category": "knowledge",
                    "confidence": 0.81,
                    "createdAt": "2026-01-02T00:00:00Z",
                    "source": "t-1",
                    "custom": {"k": [1, None, "x"]},
                },
                {
                    "id": "a3",
                    "content": "Alice said tabs",
                    "category": "correction",
                    "confidence": 0.95,
                    "createdAt": "2026-01-03T00:00:00Z",
                    "source": "t-2",
                    "sourceError": "used spaces",
                    # The memory record: its columns, a tag row and a relation row travel too.
                    "importance": 0.9,
                    "tags": ["style"],
                    "structured": {"indent": "tabs"},
                    "relations": [{"type": "supersedes", "target": "a2"}],
                },
            ],
        },
        None,
        user_id="alice",
    )
    memory = storage.load(None, user_id="alice")
    memory["facts"] = [fact for fact in memory["facts"] if fact["id"] != "a2"]  # a tombstone
    storage.save(memory, None, user_id="alice", origin="t-3")
    storage.save({"facts": [{"id": "c1", "content": "Coder agent prefers pytest"}]}, "coder", user_id="alice")
    storage.save({"facts": [{"id": "g1", "content": "legacy global fact"}]}, None)
    storage.save({"facts": [{"id": "b1", "content": "Bob old fact"}]}, None, user_id="bob")
    storage.clear(None, user_id="bob")  # cleared_at
    storage.save(
        {"facts": [{"id": "b2", "content": "Bob new fact", "confidence": 0.75}]}, None, user_id="bob"
    )
    storage.save({"facts": [{"id": "e1", "content": "Carol's fact"}]}, None, user_id="carol")
    engine = get_engine(url)
    erase_user(engine, "carol", datetime(2026, 2, 1, tzinfo=UTC))  # memory_erasures
    vector = np.array([0.6, 0.8, 0.0], dtype=np.float32)
    storage.vectors.store_vectors(("alice", None), MODEL, [("a1", "Alice likes green tea 绿茶", vector)])
    with engine.begin() as conn:
        alice = select(scopes_table.c.id).where(
            scopes_table.c.user_id == "alice", scopes_table.c.agent_name.is_(None)
        )
        conn.execute(
            update(facts_table)
            .where(facts_table.c.scope_id == alice.scalar_subquery(), facts_table.c.fact_id == "a1")
            .values(
                access_count=7, last_accessed_at=SIGNALS_AT, last_confirmed_at=SIGNALS_AT - timedelta(days=3)
            )
        )
        a1 = select(facts_table.c.id).where(
            facts_table.c.scope_id == alice.scalar_subquery(), facts_table.c.fact_id == "a1"
        )
        conn.execute(
            update(facts_table).where(facts_table.c.id == a1.scalar_subquery()).values(visibility="shared")
        )
        conn.execute(
            insert(grants_table).values(
                fact_row_id=a1.scalar_subquery(),
                grantee_kind="role",
                grantee="support",
                scope_id=alice.scalar_subquery(),
            )
        )
        conn.execute(update(scopes_table).where(scopes_table.c.user_id == "bob").values(purged_revision=1))
        # Edits by hand move the scopes' revisions (docs/schema.md): the saves' snapshots stop being current.
        conn.execute(text("UPDATE memory_scopes SET revision = revision + 1"))
        first = select(history_table.c.id).order_by(history_table.c.id.desc()).limit(1).scalar_subquery()
        conn.execute(
            update(history_table)
            .where(history_table.c.id == first)
            .values(detail={"reason": "evicted", "score": 0.41, "policy": "hybrid"})
        )
        conn.execute(insert(queue_table).values(**_queued_row()))
    storage.close()
    # The agents' documents: a live one, and a user's deleted one with its two versions.
    docs, limits = AgentDocStore(url), DocLimits(20_000, 10, 100_000, 10)
    write: dict[str, Any] = {"action": "write", "expected_version": 0, "limits": limits, "now": SIGNALS_AT}
    docs.change(
        DocScope("coder"), MAIN_DOC_PATH, lambda _: "# Coder\n- 绿茶\n", author="import", actor=None, **write
    )
    alices = DocScope("coder", "alice")
    docs.change(alices, "/memories/x.md", lambda _: "x", author="agent", actor="alice", **write)
    docs.delete(
        alices,
        "/memories/x.md",
        expected_version=1,
        author="operator",
        actor=None,
        limits=limits,
        now=SIGNALS_AT,
    )
    # The LangGraph store's items: one with its vector, one deleted (no value, no vector), and history.
    items, scope = ItemStore(url), ItemScope("acme", "alice", "coder")
    tea = ItemWrite(scope, ("memories", "alice"), "tea", '{"text":"绿茶"}', "绿茶", vector, MODEL)
    items.write([tea, ItemWrite(scope, ("memories",), "gone", '{"n":1}')], now=SIGNALS_AT, max_items=10)
    items.write([ItemWrite(scope, ("memories",), "gone", None)], now=SIGNALS_AT, max_items=10)


def _queued_row() -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "thread_id": "t-9", "user_id": "alice", "agent_name": "", "state": "pending", "generation": 1,
        "messages": [{"role": "user", "content": "hi"}], "message_chars": 2, "correction_detected": False,
        "reinforcement_detected": False, "captured_at": now, "pending_since": now, "due_at": now,
        "latest_due_at": now, "enqueued_by": "test", "created_at": now, "updated_at": now,
    }  # fmt: skip


def _rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every memory table, as values comparable across dialects.

    Timestamps in UTC; vectors as float32 lists; JSON columns parsed, plus whether the column is
    SQL NULL (which JSON ``null`` is not).
    """
    found: dict[str, list[tuple[Any, ...]]] = {}
    with get_engine(url).connect() as conn:
        for table in TABLES:
            columns: list[Any] = []
            for column in table.columns:
                columns.append(column)
                if isinstance(column.type, JSON) and column.nullable:
                    columns.append(column.is_(None))
            rows = conn.execute(select(*columns).order_by(*table.primary_key)).all()
            found[table.name] = [tuple(_comparable(value) for value in row) for row in rows]
    return found


def _comparable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, bytes | memoryview):  # a SQLite vector
        return np.frombuffer(bytes(value), dtype="<f4").tolist()
    if isinstance(value, list) and value and all(isinstance(item, float) for item in value):  # real[]
        return np.asarray(value, dtype="<f4").tolist()
    return value


def _urls(request: pytest.FixtureRequest, pair: tuple[str, str], tmp_path: Path) -> tuple[str, str]:
    def url(kind: str, name: str) -> str:
        if kind == "sqlite":
            return f"sqlite:///{tmp_path / name}.db"
        return str(request.getfixturevalue("pg_url" if name == "target" else "postgres_url"))

    return url(pair[0], "source"), url(pair[1], "target")


@pytest.mark.parametrize(
    "pair",
    [
        pytest.param(("sqlite", "postgresql"), marks=pytest.mark.postgres, id="sqlite-to-postgresql"),
        pytest.param(("postgresql", "sqlite"), marks=pytest.mark.postgres, id="postgresql-to-sqlite"),
        pytest.param(("sqlite", "sqlite"), id="sqlite-to-sqlite"),
    ],
)
def test_round_trip_keeps_every_row_of_every_table(
    request: pytest.FixtureRequest, pair: tuple[str, str], tmp_path: Path
) -> None:
    source, target = _urls(request, pair, tmp_path)
    _populate(source)
    cli, file = _cli(tmp_path), tmp_path / "memstore.jsonl.gz"
    if pair[1] == "postgresql":  # a DBA creates the schema first; SQLite is created on restore
        assert cli("db", "upgrade", "--url", target).returncode == 0

    made = cli("backup", str(file), "--url", source, "--json")
    assert made.returncode == 0, made.stderr
    summary = json.loads(made.stdout)
    assert summary["queued_not_included"] == 1
    assert "1 conversation(s) in the update queue are not in the backup" in made.stderr
    assert file.stat().st_mode & 0o077 == 0  # every user's memory: the owner's alone

    restored = cli("restore", str(file), "--url", target, "--json")
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["rows"] == summary["rows"]

    before, after = _rows(source), _rows(target)
    assert {name: len(rows) for name, rows in after.items()} == summary["rows"]
    assert all(summary["rows"].values())  # every table holds something to compare
    for table in TABLES:
        assert after[table.name] == before[table.name], table.name
    with get_engine(target).connect() as conn:
        assert conn.execute(select(queue_table.c.id)).all() == []  # the queue is not memory

    # The restored database is a working store: same documents, signals, search; new ids do not collide.
    original, copy = SqlMemoryStorage(source), SqlMemoryStorage(target)
    for agent, user in ((None, "alice"), ("coder", "alice"), (None, "bob"), (None, None)):
        assert copy.load(agent, user_id=user) == original.load(agent, user_id=user)
    assert copy.fact_signals(user_id="alice")["a1"].access_count == 7
    dispose_engines()
    env = {**cli.env, "MEMSTORE_DATABASE_URL": target}
    searched = Cli(env, target)("facts", "search", "green tea", "--json")
    assert searched.returncode == 0, searched.stderr
    assert [fact["fact_id"] for fact in json.loads(searched.stdout)["facts"]] == ["a1"]
    assert copy.save({"facts": [{"id": "n1", "content": "after the restore"}]}, None, user_id="dave")
    assert copy.load(None, user_id="dave")["facts"][0]["content"] == "after the restore"


def test_restore_refuses_a_database_that_holds_memory_unless_replacing(tmp_path: Path) -> None:
    source, target = f"sqlite:///{tmp_path / 'source.db'}", f"sqlite:///{tmp_path / 'target.db'}"
    _populate(source)
    SqlMemoryStorage(target).save({"facts": [{"id": "z", "content": "target's own"}]}, None, user_id="zoe")
    cli, file = _cli(tmp_path), tmp_path / "b.jsonl.gz"
    assert cli("backup", str(file), "--url", source).returncode == 0
    held = _rows(target)

    refused = cli("restore", str(file), "--url", target)
    assert refused.returncode == 1
    assert "already holds memory (memory_scopes: 1, memory_facts: 1, memory_history: 1)" in refused.stderr
    assert "pass --replace" in refused.stderr
    no_terminal = cli("restore", str(file), "--url", target, "--replace")
    assert no_terminal.returncode == 2
    assert "restore deletes what" in no_terminal.stderr and "memory_facts: 1" in no_terminal.stderr
    assert _rows(target) == held

    replaced = cli("restore", str(file), "--url", target, "--replace", "--yes", "--json")
    assert replaced.returncode == 0, replaced.stderr
    assert json.loads(replaced.stdout)["replaced"]["memory_facts"] == 1
    assert _rows(target) == _rows(source)


def test_a_damaged_or_foreign_file_changes_nothing(sql_url: str, tmp_path: Path) -> None:
    source, target = f"sqlite:///{tmp_path / 'source.db'}", sql_url
    storage = SqlMemoryStorage(source)
    storage.save({"facts": [{"id": "f", "content": "one"}]}, None, user_id="alice")
    erase_user(get_engine(source), "carol", datetime.now(UTC))
    cli, file = _cli(tmp_path), tmp_path / "b.jsonl.gz"
    assert cli("backup", str(file), "--url", source).returncode == 0
    lines = gzip.decompress(file.read_bytes()).decode("utf-8").splitlines(keepends=True)
    truncated = tmp_path / "truncated.jsonl.gz"
    truncated.write_bytes(gzip.compress("".join(lines[:-1]).encode("utf-8")))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    foreign = tmp_path / "memory.json"
    foreign.write_text("{}", encoding="utf-8")

    for damaged, reason in (
        (truncated, "rows of memory_erasures: it is truncated"),
        (cut, "is damaged or not a memstore backup"),
        (foreign, "is damaged or not a memstore backup"),
    ):
        result = cli("restore", str(damaged), "--url", target)
        assert result.returncode == 1, result.stderr
        assert reason in result.stderr
        assert "Traceback" not in result.stderr
    assert all(not rows for rows in _rows(target).values())  # nothing half-restored

    missing = cli("backup", str(tmp_path / "x.gz"), "--url", f"sqlite:///{tmp_path / 'none.db'}")
    assert missing.returncode == 1 and "holds no memstore schema" in missing.stderr
    assert not (tmp_path / "x.gz").exists() and not (tmp_path / "none.db").exists()


def test_backup_and_restore_hold_a_batch_not_the_database(tmp_path: Path) -> None:
    """40 MB of audit history each way; Python's own allocations stay a few MB."""
    source, target = f"sqlite:///{tmp_path / 'source.db'}", f"sqlite:///{tmp_path / 'target.db'}"
    SqlMemoryStorage(source).save({"facts": [{"id": "f", "content": "one"}]}, None, user_id="alice")
    now, payload = datetime.now(UTC), {"content": "x" * 2_000}
    with get_engine(source).begin() as conn:
        for start in range(0, 10_000, 2_000):
            conn.execute(
                insert(history_table),
                [
                    {"scope_id": 1, "revision": 1, "changed_at": now, "entity": "fact", "entity_id": f"f{i}",
                     "action": "update", "origin": "bulk", "before": payload, "after": payload}
                    for i in range(start, start + 2_000)
                ],
            )  # fmt: skip
    file = tmp_path / "big.jsonl.gz"

    tracemalloc.start()
    try:
        backup_database(source, file)
        _, backup_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        restore_database(target, file)
        _, restore_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert backup_peak < 16 * 2**20, backup_peak
    assert restore_peak < 16 * 2**20, restore_peak
    with get_engine(target).connect() as conn:
        assert len(conn.execute(select(history_table.c.id)).all()) == 10_001
