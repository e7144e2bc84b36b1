"""SqlMemoryStorage beyond the shared contract: DB invariants, minimal writes, cache, merge and codec."""

from __future__ import annotations

import json
import logging
import sqlite3
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from memstore.config import MemoryConfig
from memstore.document import create_empty_memory
from memstore.errors import StaleDocumentError, StorageUnavailableError
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.documents import provider as storage_module
from memstore.storage.sql.engine import get_engine
from tests.support.statements import sent_statements


def _fact(index: int, content: str | None = None, **extra: Any) -> dict[str, Any]:
    fact: dict[str, Any] = {
        "id": f"fact_{index:08x}",
        "content": content if content is not None else f"fact number {index}",
        "category": "context",
        "confidence": 0.8,
        "createdAt": "2026-07-14T15:35:46.123456Z",
        "source": "thread-1",
    }
    fact.update(extra)
    return fact


def _doc(*facts: dict[str, Any]) -> dict[str, Any]:
    doc = create_empty_memory()
    doc["facts"] = list(facts)
    return doc


def _contents(doc: dict[str, Any]) -> list[str]:
    return [fact["content"] for fact in doc["facts"]]


def _sql(statements: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(s, n) for s, n in statements if not s.startswith(("BEGIN", "COMMIT", "ROLLBACK"))]


@pytest.fixture
def big_cap(isolated_config: MemoryConfig) -> None:
    isolated_config.max_facts = 500


# --- invariants the database enforces on its own -------------------------------------------------


def _scope_id(engine: Engine, user_id: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(text("SELECT id FROM memory_scopes WHERE user_id = :u"), {"u": user_id}).one()[0]
        )


def _insert_fact_sql(engine: Engine, scope_id: int, fact_id: str, content: str, confidence: float) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO memory_facts (scope_id, fact_id, position, content, content_key, category,"
                " confidence, extra, added_revision, updated_revision)"
                " VALUES (:s, :f, 99, :c, :k, 'context', :conf, '{}', 1, 1)"
            ),
            {"s": scope_id, "f": fact_id, "c": content, "k": content.strip().casefold(), "conf": confidence},
        )


def test_database_rejects_out_of_range_confidence_and_live_duplicates(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_doc(_fact(1, "Likes tea")), user_id="alice")
    engine = get_engine(sql_url)
    scope_id = _scope_id(engine, "alice")
    with pytest.raises(IntegrityError):
        _insert_fact_sql(engine, scope_id, "fact_bad00001", "other", 1.5)
    with pytest.raises(IntegrityError):
        _insert_fact_sql(engine, scope_id, "fact_bad00002", "  LIKES TEA ", 0.5)
    # A tombstoned fact does not block the same content from living again.
    assert storage.save(_doc(), user_id="alice")
    _insert_fact_sql(engine, scope_id, "fact_ok000001", "likes tea", 0.5)


def test_deleting_a_scope_cascades_to_its_rows(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    doc = _doc(_fact(1), _fact(2))
    doc["user"]["workContext"] = {"summary": "memstore", "updatedAt": "2026-07-14T15:35:46Z"}
    assert storage.save(doc, user_id="alice")
    engine = get_engine(sql_url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM memory_scopes WHERE user_id = 'alice'"))
    with engine.connect() as conn:
        for table in ("memory_facts", "memory_sections", "memory_history"):
            assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == 0


# --- writes follow the size of the change ----------------------------------------------------------


@pytest.mark.usefixtures("big_cap")
def test_adding_one_fact_to_a_large_scope_writes_one_fact_row(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_doc(*(_fact(i) for i in range(100))), user_id="alice")
    doc = storage.load(user_id="alice")
    doc["facts"].append(_fact(1000, "one more"))
    with sent_statements(get_engine(sql_url)) as seen:
        assert storage.save(doc, user_id="alice", origin="test")
    writes = [(s.split(" (")[0].split(" SET")[0], n) for s, n in _sql(seen) if not s.startswith("SELECT")]
    assert writes == [
        ("INSERT INTO memory_facts", 1),
        ("INSERT INTO memory_history", 1),
        ("UPDATE memory_scopes", 1),
        ("INSERT INTO memory_scope_snapshots", 1),  # the derived document, replaced
    ]
    with get_engine(sql_url).connect() as conn:
        history = conn.execute(
            text("SELECT entity_id, action, origin, before IS NULL FROM memory_history WHERE revision = 2")
        ).all()
    assert [tuple(row) for row in history] == [("fact_000003e8", "insert", "test", True)]


@pytest.mark.usefixtures("big_cap")
def test_deleting_and_editing_touch_only_those_rows(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_doc(*(_fact(i) for i in range(50))), user_id="alice")
    doc = storage.load(user_id="alice")
    del doc["facts"][0]  # deleting the first fact must not renumber the others
    doc["facts"][10]["confidence"] = 0.95
    with sent_statements(get_engine(sql_url)) as seen:
        assert storage.save(doc, user_id="alice")
    writes = [(s.split(" (")[0].split(" SET")[0], n) for s, n in _sql(seen) if not s.startswith("SELECT")]
    # One tombstone, one edited row, two audit rows, the scope and its snapshot; no position rewrites.
    assert writes == [
        ("UPDATE memory_facts", 1),
        ("UPDATE memory_facts", 1),
        ("INSERT INTO memory_history", 2),
        ("UPDATE memory_scopes", 1),
        ("INSERT INTO memory_scope_snapshots", 1),
    ]
    assert storage.reload(user_id="alice")["facts"] == doc["facts"]


def test_a_save_that_changes_nothing_writes_nothing(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_doc(_fact(1)), user_id="alice")
    doc = storage.load(user_id="alice")
    with sent_statements(get_engine(sql_url)) as seen:
        assert storage.save(doc, user_id="alice")
        assert storage.save(_doc(), user_id="empty-user")
    assert all(s.startswith("SELECT") or "memory_scopes" in s for s, _ in _sql(seen))
    assert not any(s.startswith(("UPDATE", "DELETE")) for s, _ in _sql(seen))
    assert storage.reload(user_id="alice")["revision"] == doc["revision"] == 1
    with get_engine(sql_url).connect() as conn:
        # The empty scope's tentative row was rolled back with its no-op save.
        assert conn.execute(text("SELECT count(*) FROM memory_scopes")).scalar_one() == 1


# --- the cache ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("big_cap")
def test_a_cached_load_costs_one_query_on_the_scope_row(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_doc(*(_fact(i) for i in range(200))), user_id="alice")
    storage.load(user_id="alice")
    with sent_statements(get_engine(sql_url)) as seen:
        doc = storage.load(user_id="alice")
    assert len(doc["facts"]) == 200
    queries = _sql(seen)
    assert len(queries) == 1
    assert "FROM memory_scopes" in queries[0][0] and "memory_facts" not in queries[0][0]


def test_a_cold_load_is_one_statement(sql_url: str) -> None:
    assert SqlMemoryStorage(sql_url).save(_doc(_fact(1), _fact(2)), user_id="alice")
    fresh = SqlMemoryStorage(sql_url)
    with sent_statements(get_engine(sql_url)) as seen:
        assert len(fresh.load(user_id="alice")["facts"]) == 2
    assert len(_sql(seen)) == 1


def test_the_cache_is_not_shared_with_the_callers_objects(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    doc = _doc(_fact(1, topics={"a": [1, 2]}))
    assert storage.save(doc, user_id="alice")
    doc["facts"][0]["topics"]["a"].append(3)
    assert storage.load(user_id="alice")["facts"][0]["topics"] == {"a": [1, 2]}


def test_a_scope_erased_and_rebuilt_to_the_same_revision_is_not_served_from_cache(sql_url: str) -> None:
    reader, writer = SqlMemoryStorage(sql_url), SqlMemoryStorage(sql_url)
    assert writer.save(_doc(_fact(1, "before erase")), user_id="alice")
    assert _contents(reader.load(user_id="alice")) == ["before erase"]
    with get_engine(sql_url).begin() as conn:
        conn.execute(text("DELETE FROM memory_scopes"))
    assert writer.save(_doc(_fact(2, "after erase")), user_id="alice")
    assert _contents(reader.load(user_id="alice")) == ["after erase"]


# --- revisions and merge semantics -----------------------------------------------------------------


def test_loaded_documents_carry_the_scope_revision(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.load(user_id="alice")["revision"] == 0
    assert storage.save(_doc(_fact(1)), user_id="alice")
    assert storage.load(user_id="alice")["revision"] == 1
    doc = storage.load(user_id="alice")
    doc["facts"].append(_fact(2))
    assert storage.save(doc, user_id="alice")
    assert storage.load(user_id="alice")["revision"] == 2
    assert SqlMemoryStorage(sql_url).reload(user_id="alice")["revision"] == 2


def test_a_document_without_revision_replaces_the_scope(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_doc(_fact(1, "old one"), _fact(2, "old two")), user_id="alice")
    doc = storage.load(user_id="alice")
    doc["facts"] = [_fact(3, "new")]
    assert storage.save(doc, user_id="alice")  # now fact 3 only; revision 2
    # An import of the original document (no revision) replaces again and revives fact 1.
    assert storage.save(_doc(_fact(2, "old two"), _fact(1, "old one")), user_id="alice")
    loaded = storage.reload(user_id="alice")
    assert _contents(loaded) == ["old two", "old one"]
    assert loaded["revision"] == 3


def test_a_stale_document_merges_instead_of_replacing(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_doc(_fact(1, "one"), _fact(2, "two")), user_id="alice")
    stale = storage.load(user_id="alice")
    fresh = storage.load(user_id="alice")
    fresh["facts"].append(_fact(3, "three"))
    fresh["facts"][0]["confidence"] = 0.99
    assert storage.save(fresh, user_id="alice")
    stale["facts"][0]["confidence"] = 0.1  # edited concurrently: the first committer wins
    stale["facts"].append(_fact(4, "four"))
    assert storage.save(stale, user_id="alice")
    loaded = storage.reload(user_id="alice")
    assert _contents(loaded) == ["one", "two", "three", "four"]
    assert loaded["facts"][0]["confidence"] == 0.99


def test_a_revision_from_the_future_is_dropped(sql_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A revision the store never reached means the scope was erased and re-created since the load."""
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_doc(_fact(1, "one"), _fact(2, "two")), user_id="alice")
    doc = _doc(_fact(2, "two"))
    doc["revision"] = 99
    with caplog.at_level(logging.WARNING), pytest.raises(StaleDocumentError):
        storage.save(doc, user_id="alice")
    assert _contents(storage.reload(user_id="alice")) == ["one", "two"]
    assert "revision 99" in caplog.text and "dropped" in caplog.text


def test_max_facts_drops_the_lowest_confidence_facts(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)  # max_facts defaults to 100
    facts = [_fact(i, confidence=0.5) for i in range(100)]
    facts[7]["confidence"] = 0.4
    facts.append(_fact(100, confidence=0.9))
    facts.append(_fact(101, confidence=0.5))
    assert storage.save(_doc(*facts), user_id="alice")
    ids = [fact["id"] for fact in storage.reload(user_id="alice")["facts"]]
    assert len(ids) == 100
    # The 0.4 fact goes first, then the latest of the tied 0.5 facts.
    assert "fact_00000007" not in ids and "fact_00000065" not in ids and "fact_00000064" in ids


# --- codec: exact round trips ----------------------------------------------------------------------


def test_odd_values_and_missing_keys_round_trip_exactly(sql_url: str) -> None:
    facts: list[dict[str, Any]] = [
        {"id": "fact_00000001", "content": "date only", "createdAt": "2026-07-14"},
        {"id": "fact_00000002", "content": "offset", "createdAt": "2026-07-14T15:35:46+08:00"},
        {"id": "fact_00000003", "content": "garbage", "createdAt": "last tuesday", "source": None},
        {"id": "fact_00000004", "content": "numbers", "createdAt": 12345, "confidence": 1, "source": 7},
        {"id": "fact_00000005", "content": "bare"},
        {
            "id": "fact_00000006",
            "content": "reserved key",
            "$memstore": {"raw": "user data"},
            "category": "x" * 100,
            "sourceError": ["not", "a", "string"],
            "nested": {"deep": [1, 1.0, True, None, "s"]},
        },
        _fact(7, "canonical"),
        _fact(8, "naive", createdAt="2026-07-14T15:35:46"),
        _fact(9, "  padded content  ", category="correction", sourceError="was wrong"),
    ]
    doc = _doc(*facts)
    doc["user"]["workContext"] = {"summary": "works", "updatedAt": "2026-07-14", "note": 1}
    doc["user"]["topOfMind"] = {"summary": "no timestamp"}
    doc["history"]["recentMonths"] = {"summary": 5, "updatedAt": None}
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(doc, user_id="alice")
    for loaded in (storage.load(user_id="alice"), SqlMemoryStorage(sql_url).reload(user_id="alice")):
        assert json.dumps(loaded["facts"], sort_keys=True) == json.dumps(facts, sort_keys=True)
        assert json.dumps(loaded["user"], sort_keys=True) == json.dumps(doc["user"], sort_keys=True)
        assert json.dumps(loaded["history"], sort_keys=True) == json.dumps(doc["history"], sort_keys=True)
    # Parseable timestamps still land in the real column, normalised to UTC, for SQL queries.
    with get_engine(sql_url).connect() as conn:
        stored = conn.execute(
            text("SELECT created_at FROM memory_facts WHERE fact_id = 'fact_00000002'")
        ).scalar_one()
    if isinstance(stored, str):  # SQLite returns text for a raw query
        stored = datetime.fromisoformat(stored).replace(tzinfo=UTC)
    assert stored == datetime(2026, 7, 14, 7, 35, 46, tzinfo=UTC)


def test_non_conforming_confidences_are_normalised(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    raw = ["0.9", 1.5, -1, None, True, "high"]
    assert storage.save(_doc(*(_fact(i, confidence=c) for i, c in enumerate(raw))), user_id="alice")
    loaded = [fact["confidence"] for fact in storage.reload(user_id="alice")["facts"]]
    assert loaded == [0.9, 1.0, 0.0, 0.5, 0.5, 0.5]


# --- malformed input never costs stored data -------------------------------------------------------


@pytest.mark.parametrize(
    "patch",
    [
        {"facts": "not a list"},
        {"facts": [["not", "a", "dict"]]},
        {"facts": [{"id": "fact_00000009", "content": 5}]},
        {"facts": [{"id": "fact_00000009", "content": "   "}]},
        {"facts": [{"id": "fact_00000009"}]},
        {"facts": [{"id": "fact_00000009", "content": "nan", "confidence": 0.5, "x": float("nan")}]},
        {"user": "not a dict"},
        {"user": {"workContext": "not a dict"}},
        {"revision": "3"},
        {"revision": -1},
    ],
)
def test_malformed_documents_are_refused_and_change_nothing(
    sql_url: str, patch: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_doc(_fact(1, "kept")), user_id="alice")
    doc = storage.load(user_id="alice")
    doc.update(patch)
    assert storage.save(doc, user_id="alice") is False
    assert "malformed" in caplog.text
    assert _contents(SqlMemoryStorage(sql_url).reload(user_id="alice")) == ["kept"]


def test_a_document_that_is_not_a_dict_is_refused(sql_url: str) -> None:
    assert SqlMemoryStorage(sql_url).save(["not", "a", "document"], user_id="alice") is False  # type: ignore[arg-type]


def test_a_document_without_facts_deletes_nothing(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_doc(_fact(1, "kept")), user_id="alice")
    assert storage.save(
        {"user": {"workContext": {"summary": "new", "updatedAt": "2026-07-14T15:35:46Z"}}}, user_id="alice"
    )
    loaded = storage.reload(user_id="alice")
    assert _contents(loaded) == ["kept"]
    assert loaded["user"]["workContext"]["summary"] == "new"


def test_odd_and_duplicate_ids_get_fresh_ids(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    doc = _doc(_fact(1, "first"), _fact(1, "same id"), _fact(2, "no id"), _fact(3, "int id"))
    del doc["facts"][2]["id"]
    doc["facts"][3]["id"] = 3
    assert storage.save(doc, user_id="alice")
    facts = storage.reload(user_id="alice")["facts"]
    assert [fact["content"] for fact in facts] == ["first", "same id", "no id", "int id"]
    ids = [fact["id"] for fact in facts]
    assert ids[0] == "fact_00000001" and len(set(ids)) == 4
    assert all(len(fact_id) == 13 and fact_id.startswith("fact_") for fact_id in ids)


def test_a_non_object_extra_written_by_hand_does_not_break_loading(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    assert storage.save(_doc(_fact(1, "hand edited")), user_id="alice")
    with get_engine(sql_url).begin() as conn:
        conn.execute(text("UPDATE memory_facts SET extra = '[1, 2]'"))
        conn.execute(text("UPDATE memory_scopes SET revision = revision + 1"))  # a hand edit: rows are read
    assert _contents(SqlMemoryStorage(sql_url).load(user_id="alice")) == ["hand edited"]


# --- errors are logged without secrets -------------------------------------------------------------


def test_database_errors_are_logged_with_the_password_masked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = "postgresql+psycopg://memstore:s3cr3t-Pa55@127.0.0.1:1/memstore?connect_timeout=2"
    # Unreachable at first use: the schema check reports an outage, with the password masked.
    with pytest.raises(StorageUnavailableError) as first_use:
        SqlMemoryStorage(url)
    assert "memstore:***@127.0.0.1:1" in str(first_use.value) and "s3cr3t" not in str(first_use.value)
    # Skip the schema check to exercise the save path's error handling.
    monkeypatch.setattr(storage_module, "prepare_once", lambda engine, *, auto_migrate: None)
    storage = SqlMemoryStorage(url)
    assert storage.url == "postgresql+psycopg://memstore:***@127.0.0.1:1/memstore?connect_timeout=2"
    with caplog.at_level(logging.ERROR), pytest.raises(StorageUnavailableError) as saving:
        storage.save(_doc(_fact(1)), user_id="alice")
    assert "memstore:***@127.0.0.1:1" in str(saving.value) and "s3cr3t" not in str(saving.value)
    assert "failed to save memory" in caplog.text
    assert "memstore:***@127.0.0.1:1" in caplog.text
    assert "s3cr3t-Pa55" not in caplog.text


def _bind_limit(url: str) -> int:
    """Bound parameters one statement may carry on this backend (this SQLite build's own limit)."""
    if not url.startswith("sqlite"):
        return 65_535
    with sqlite3.connect(":memory:") as conn:
        return conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)


def test_a_document_naming_more_facts_than_one_statement_can_bind_is_saved(sql_url: str) -> None:
    """An import of about 250k facts used to fail with "too many SQL variables" and abort."""
    storage = SqlMemoryStorage(sql_url)
    returning = [_fact(900_000 + i, f"returning {i}", confidence=0.99) for i in range(10)]
    assert storage.save(_doc(*returning), user_id="alice")
    assert storage.save(_doc(_fact(1, "placeholder")), user_id="alice")  # tombstones the ten
    count = _bind_limit(sql_url) + 1
    huge = _doc(*(_fact(i, f"bulk {i}", confidence=0.5) for i in range(count - len(returning))), *returning)

    assert storage.save(huge, user_id="alice", origin="import")

    stored = storage.reload(user_id="alice")
    assert len(stored["facts"]) == 100  # max_facts: the ten returning facts are the most confident
    assert {f["content"] for f in returning} <= set(_contents(stored))
