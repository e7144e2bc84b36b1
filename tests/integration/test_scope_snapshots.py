"""The derived snapshot row of a scope always says what its rows say (issue 37).

A save writes each scope's document to ``memory_scope_snapshots`` in its transaction, and a cold
load reads it instead of the rows while its revision is the scope's. The invariant checked after
every step: each current snapshot row loads to exactly (JSON text: key order and ``1`` against
``1.0`` count) the document the same load builds from the rows, read in the same transaction with
the snapshot rows deleted and rolled back. Steps: random edits of rich documents (unknown keys, odd
confidences and stamps, records, tags, relations, facts shared with a user and a role or public)
through two storages whose caches go stale (the fast path and the full merge of concurrent writers),
clears, an erase of a user others shared facts with, a vacuum of every tombstone and a hand edit
that moves the revision. On SQLite, PostgreSQL, PostgreSQL's partitioned layout and PostgreSQL
through an application role bound by row-level security.
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text

from memstore.document import SECTION_GROUPS
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.documents import saving
from memstore.storage.sql.documents.cache import CacheEntry
from memstore.storage.sql.documents.load import read_entry
from memstore.storage.sql.documents.statements import scope_keys
from memstore.storage.sql.documents.stored import write_snapshot
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.maintenance.erase import erase_user, vacuum
from memstore.storage.sql.schema import migrate
from tests.support.app_role import app_role_url

SCOPES = [("alice", None), ("alice", "coder"), ("bob", None)]


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgresql", marks=pytest.mark.postgres),
        pytest.param("postgres_partitioned", id="postgresql-partitioned", marks=pytest.mark.postgres),
        pytest.param("rls", id="postgresql-row-level-security", marks=pytest.mark.postgres),
    ]
)
def urls(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """``(application URL, owner URL)``: the same database, the first bound by the policies for ``rls``."""
    if request.param != "rls":
        url = str(request.getfixturevalue(f"{request.param}_url"))
        yield url, url
        return
    owner = str(request.getfixturevalue("postgres_url"))
    with app_role_url(owner) as app:
        yield app, owner


def _check(owner_url: str) -> int:
    """Every current snapshot row against its scope's rows; returns how many scopes have one."""
    engine = get_engine(owner_url)
    with engine.connect() as conn:
        scopes = conn.execute(
            text(
                "SELECT s.tenant_id, s.user_id, s.agent_name FROM memory_scopes s "
                "JOIN memory_scope_snapshots d ON d.scope_id = s.id AND d.revision = s.revision"
            )
        ).all()
    for tenant_id, user_id, agent_name in scopes:
        keys = scope_keys((user_id, agent_name), tenant_id)
        with engine.connect() as conn:
            from_snapshot = read_entry(conn, keys)
            transaction = conn.begin()
            conn.execute(text("DELETE FROM memory_scope_snapshots"))
            from_rows = read_entry(conn, keys)
            transaction.rollback()
        assert from_snapshot is not None and from_rows is not None
        assert from_snapshot.stamp == from_rows.stamp
        assert _text(from_snapshot.take()) == _text(from_rows.take()), (user_id, agent_name)
    return len(scopes)


def _text(document: dict[str, Any]) -> str:
    return json.dumps(document, ensure_ascii=False)


_STAMPS: list[Any] = ["2026-07-14T15:35:46Z", "2026-07-14T15:35:46.5Z", "2026-07-14", "+02:00 soon", None]
_EXTRA: list[Any] = [  # what JSONB rewrites too: -0.0, 1e16, key order
    {"a": [1, {"b": None}]},
    2**70,
    -0.0,
    1e16,
    True,
    "x\u2028y",
    1.5e-300,
    {"zz": 1, "a": 0},
]
_TEXT = ["plain", "中文记忆", "émoji 🧠", "line\nbreak"]


def _fact(rng: random.Random, serial: int, ids: list[str]) -> dict[str, Any]:
    fact: dict[str, Any] = {
        "id": f"f{serial}",
        "content": f"{rng.choice(_TEXT)} {serial}",
        "category": rng.choice(["preference", "knowledge", "context", "correction"]),
        "confidence": rng.choice([round(rng.random(), 2), rng.random(), 0, 1, True, "0.7", 5e-324]),
    }
    stamp = rng.choice(_STAMPS)
    if stamp is not None:
        fact["createdAt"] = stamp
    if rng.random() < 0.3:
        fact["source"] = rng.choice(["thread-1", 7, None])
    if rng.random() < 0.2:
        fact[rng.choice(["weird key", "topics", "n"])] = rng.choice(_EXTRA)
    if rng.random() < 0.3:
        fact["visibility"] = rng.choice(["shared", "public"])
        if fact["visibility"] == "shared":
            fact["allowedUsers"], fact["allowedRoles"] = ["bob"], ["support"]
    if rng.random() < 0.3:
        fact["tags"] = rng.sample(["work", "home", "rust", "tea"], 2)
        fact["importance"] = rng.choice([0.9, 0.1])
    if ids and rng.random() < 0.3:
        fact["relations"] = [{"kind": "related_to", "target": rng.choice(ids)}]
    return fact


def _edit(rng: random.Random, document: dict[str, Any], serial: int) -> None:
    facts: list[dict[str, Any]] = document.setdefault("facts", [])
    ids = [fact["id"] for fact in facts]
    kind = rng.choice(["add", "add", "remove", "edit", "reorder", "section", "share", "nothing"])
    if kind == "add" or not facts:
        facts.extend(_fact(rng, serial * 10 + i, ids) for i in range(rng.randint(1, 3)))
    elif kind == "remove":
        del facts[rng.randrange(len(facts))]
    elif kind == "edit":
        fact = rng.choice(facts)
        fact["content"] = f"edited {serial}"
        fact["confidence"] = rng.choice([0.25, 1, 0.3333333333333333])
    elif kind == "reorder":
        rng.shuffle(facts)
    elif kind == "section":
        group = rng.choice(list(SECTION_GROUPS))
        name = rng.choice(SECTION_GROUPS[group])
        section = {"summary": f"summary {serial}", "updatedAt": rng.choice(["2026-07-14T15:35:46Z", "soon"])}
        if rng.random() < 0.3:
            section["mood"] = rng.choice(_EXTRA)
        document.setdefault(group, {})[name] = section
        document["version"] = rng.choice(["1.0", "2.0"])
    elif kind == "share":
        fact = rng.choice(facts)
        fact["visibility"] = rng.choice(["private", "public", "shared"])
        fact["allowedUsers"] = ["bob"] if fact["visibility"] == "shared" else []


@pytest.mark.parametrize("seed", range(3))
def test_a_current_snapshot_always_equals_the_rows(urls: tuple[str, str], seed: int) -> None:
    app_url, owner_url = urls
    rng = random.Random(seed)
    # Two "processes" sharing facts (editor), each with its own cache.
    first, second = (SqlMemoryStorage(app_url).for_identity(roles=["editor"]) for _ in range(2))
    stale: dict[tuple[str, str | None], dict[str, Any]] = {}
    for serial in range(30):
        user, agent = rng.choice(SCOPES)
        writer = rng.choice([first, second])
        if (user, agent) in stale and rng.random() < 0.3:
            document = stale.pop((user, agent))  # loaded before another writer's save: merged
        else:
            document = writer.load(agent, user_id=user)
            if rng.random() < 0.3:
                stale[(user, agent)] = json.loads(json.dumps(document))
        _edit(rng, document, serial)
        if rng.random() < 0.05:
            assert writer.clear(agent, user_id=user)
        else:
            assert writer.save(document, agent, user_id=user)
        _check(owner_url)
    assert _check(owner_url) > 0  # not vacuous: saves left current snapshots to compare

    erase_user(get_engine(owner_url), "bob", datetime.now(UTC))  # alice's grants to bob go
    _check(owner_url)
    assert first.save({"facts": [_fact(rng, 999, [])]}, user_id="alice")  # after the erase
    vacuum(get_engine(owner_url), datetime.now(UTC) + timedelta(days=1))  # every tombstone purged
    _check(owner_url)
    assert SqlMemoryStorage(app_url).reload(user_id="alice") == first.load(user_id="alice")


def test_a_hand_edit_that_moves_the_revision_is_read_from_the_rows(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save({"facts": [{"id": "f1", "content": "before", "category": "context"}]}, user_id="a")
    engine: Engine = get_engine(sql_url)
    with engine.begin() as conn:  # what docs/schema.md asks of a DBA who edits a document's rows
        conn.execute(text("UPDATE memory_facts SET content = 'by hand'"))
        conn.execute(text("UPDATE memory_scopes SET revision = revision + 1"))
    assert _check(sql_url) == 0  # the snapshot is no longer current
    assert SqlMemoryStorage(sql_url).reload(user_id="a")["facts"][0]["content"] == "by hand"
    document = storage.load(user_id="a")
    document["facts"].append({"id": "f2", "content": "after", "category": "context"})
    assert storage.save(document, user_id="a")
    assert _check(sql_url) == 1  # the next save writes it again


_SHARED = {
    "id": "f1",
    "content": "shared",
    "category": "context",
    "visibility": "shared",
    "allowedUsers": ["bob"],
}


def _grants_to_bob(url: str) -> int:
    with get_engine(url).connect() as conn:
        return int(
            conn.execute(text("SELECT count(*) FROM memory_fact_grants WHERE grantee = 'bob'")).scalar_one()
        )


def test_an_erase_reaches_warm_caches_and_documents_loaded_before_it(sql_url: str) -> None:
    """Erasing bob moves the revision of alice's scope, whose fact named him: a process that cached
    her document before the erase loads it again, its fast-path save writes no snapshot granting bob,
    and a document loaded before the erase that edits the fact keeps the stored one (no bob)."""
    first, second = (SqlMemoryStorage(sql_url).for_identity(roles=["editor"]) for _ in range(2))
    assert first.save({"facts": [_SHARED]}, user_id="alice")
    assert first.load(user_id="alice")["facts"][0]["allowedUsers"] == ["bob"]  # cached
    before_erase = second.load(user_id="alice")
    erase_user(get_engine(sql_url), "bob", datetime.now(UTC))
    assert _check(sql_url) == 0  # the scope moved past its snapshot

    document = first.load(user_id="alice")
    assert "allowedUsers" not in document["facts"][0]
    document["facts"].append({"id": "f2", "content": "unrelated", "category": "context"})
    assert first.save(document, user_id="alice")  # the fast path, from what was loaded after the erase
    assert _check(sql_url) == 1

    before_erase["facts"][0]["content"] = "edited"  # a document loaded before the erase
    assert second.save(before_erase, user_id="alice")
    fresh = SqlMemoryStorage(sql_url).reload(user_id="alice")
    assert [fact.get("allowedUsers") for fact in fresh["facts"]] == [None, None]
    assert fresh["facts"][0]["content"] == "shared"  # the erase changed it first: first committer wins
    assert _grants_to_bob(sql_url) == 0
    _check(sql_url)


@pytest.mark.postgres
def test_an_erase_waiting_on_a_save_of_a_scope_it_ungrants_leaves_no_current_snapshot_naming_the_user(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save of alice's scope holds its lock, paused before it writes the snapshot, while bob's erase
    waits for that lock; the save's snapshot, which still grants bob, is then no longer current."""
    storage = SqlMemoryStorage(postgres_url).for_identity(roles=["editor"])
    assert storage.save({"facts": [_SHARED]}, user_id="alice")
    reached, go = threading.Event(), threading.Event()

    def paused(conn: Any, scope_id: int, entry: CacheEntry) -> None:
        reached.set()
        assert go.wait(60)
        write_snapshot(conn, scope_id, entry)

    monkeypatch.setattr(saving, "write_snapshot", paused)
    added = {"id": "f2", "content": "new", "category": "context"}
    writer = SqlMemoryStorage(postgres_url).for_identity(roles=["editor"])  # no cache: the rows path
    save = threading.Thread(target=lambda: writer.save({"facts": [_SHARED, added]}, user_id="alice"))
    save.start()
    assert reached.wait(60)
    erase = threading.Thread(target=lambda: erase_user(get_engine(postgres_url), "bob", datetime.now(UTC)))
    erase.start()
    with get_engine(postgres_url).connect() as conn:  # until the erase waits on the scope's row lock
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%'"
        )
        while erase.is_alive() and not conn.execute(text(waiting)).scalar_one():
            conn.rollback()
    go.set()
    save.join(60)
    erase.join(60)
    assert not save.is_alive() and not erase.is_alive()
    monkeypatch.undo()
    assert _check(postgres_url) == 0
    fresh = SqlMemoryStorage(postgres_url).reload(user_id="alice")
    assert [fact.get("allowedUsers") for fact in fresh["facts"]] == [None, None]
    assert _grants_to_bob(postgres_url) == 0


@pytest.mark.postgres
def test_the_migration_gives_each_role_on_snapshots_only_what_it_holds_on_facts(pg_url: str) -> None:
    """Revision 0013 mirrors each privilege on ``memory_facts`` separately: a role that only reads
    facts reads snapshots and writes none; one that writes facts writes snapshots too."""
    migrate.upgrade(pg_url, "0012")
    suffix = os.urandom(4).hex()
    reader, writer = f"memstore_reader_{suffix}", f"memstore_writer_{suffix}"
    owner = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    try:
        with owner.connect() as conn:
            conn.execute(text(f"CREATE ROLE {reader} NOLOGIN"))
            conn.execute(text(f"CREATE ROLE {writer} NOLOGIN"))
            conn.execute(text(f"GRANT SELECT ON memory_facts TO {reader}"))
            conn.execute(text(f"GRANT SELECT, INSERT, DELETE ON memory_facts TO {writer}"))
            conn.execute(text(f"GRANT UPDATE (content, updated_revision) ON memory_facts TO {writer}"))
        migrate.upgrade(pg_url)
        table = "SELECT has_table_privilege(:role, 'memory_scope_snapshots', :privilege)"
        column = "SELECT has_column_privilege(:role, 'memory_scope_snapshots', 'document', 'UPDATE')"
        with owner.connect() as conn:
            for role, writes in ((reader, False), (writer, True)):
                held = {
                    privilege: conn.execute(text(table), {"role": role, "privilege": privilege}).scalar_one()
                    for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE")
                }
                # UPDATE only of the columns a save rewrites, not of the table.
                assert held == {"SELECT": True, "INSERT": writes, "UPDATE": False, "DELETE": writes}, role
                assert conn.execute(text(column), {"role": role}).scalar_one() is writes, role
    finally:
        dispose_engines()
        with owner.connect() as conn:
            for role in (reader, writer):
                conn.execute(text(f"DROP OWNED BY {role}"))
                conn.execute(text(f"DROP ROLE {role}"))
        owner.dispose()
