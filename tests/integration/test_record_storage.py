"""The memory record's fields in the SQL provider: columns, tags, relations, versions, revision 0009.

Every test runs on a real SQLite file and a real PostgreSQL database. The document is the contract
(``memstore.record``): a key shows only when it differs from its default, tags and relations are
sets, and a fact that sets none of them reads byte for byte as before.
"""

from __future__ import annotations

import json
import logging
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select, text

from memstore.record import checked_structured
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.maintenance.erase import erase_user, vacuum
from memstore.storage.sql.schema.migrate import downgrade, upgrade
from memstore.storage.sql.schema.models import (
    facts_table,
    history_table,
    relations_table,
    scopes_table,
    tags_table,
)

RECORD = {
    "type": "semantic",
    "importance": 0.8,
    "tags": ["tea", "drink"],
    "sourceKind": "explicit_user_input",
    "raw": "honestly, I only drink green tea",
    "structured": {"drink": ["green tea"], "strength": 2},
}


def _fact(fact_id: str, content: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": fact_id,
        "content": content,
        "category": "preference",
        "confidence": 0.9,
        "createdAt": "2026-11-20T10:00:00Z",
        "source": "thread-1",
        **fields,
    }


def _save(storage: SqlMemoryStorage, *facts: dict[str, Any], user: str = "alice") -> None:
    document = storage.load(None, user_id=user)
    document["facts"] = list(facts)
    assert storage.save(document, None, user_id=user)


def _cold(url: str, user: str = "alice") -> dict[str, Any]:
    """What a fresh process reads: no cache of this instance, the rows alone."""
    dispose_engines()
    return SqlMemoryStorage(url).load(None, user_id=user)


def test_each_field_round_trips_through_columns_and_rows(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    _save(storage, _fact("f_old", "drinks coffee"), _fact("f_new", "drinks green tea only", **RECORD))
    document = _save_relation(storage)
    loaded = _cold(sql_url)
    assert loaded["facts"] == document["facts"]
    new = loaded["facts"][0]
    assert new["tags"] == ["drink", "tea"]  # a set: stored and read back sorted
    assert new["relations"] == [{"type": "supersedes", "target": "f_old"}]
    with get_engine(sql_url).connect() as conn:
        row = conn.execute(
            select(
                facts_table.c.memory_type,
                facts_table.c.importance,
                facts_table.c.source_kind,
                facts_table.c.raw,
                facts_table.c.structured,
                facts_table.c.extra,
            ).where(facts_table.c.fact_id == "f_new")
        ).one()
        tags = conn.execute(select(tags_table.c.tag).order_by(tags_table.c.tag)).scalars().all()
        relations = conn.execute(
            select(relations_table.c.fact_id, relations_table.c.kind, relations_table.c.target_fact_id)
        ).all()
    # Real columns, not a JSON blob: nothing of the record is left in ``extra``.
    assert tuple(row) == ("semantic", 0.8, "explicit_user_input", RECORD["raw"], RECORD["structured"], {})
    assert tags == ["drink", "tea"]
    assert relations == [("f_new", "supersedes", "f_old")]


def _save_relation(storage: SqlMemoryStorage) -> dict[str, Any]:
    """Replace f_old by f_new (a correction): f_old is tombstoned, f_new supersedes it."""
    document = storage.load(None, user_id="alice")
    document["facts"] = [dict(document["facts"][1], relations=[{"type": "supersedes", "target": "f_old"}])]
    assert storage.save(document, None, user_id="alice")
    return storage.load(None, user_id="alice")


def test_a_fact_without_record_fields_reads_byte_for_byte_as_before(sql_url: str) -> None:
    plain = _fact("f1", "likes tea")
    # Stated at their defaults, the keys are kept as given too (the codec's lossless rule).
    at_defaults = _fact(
        "f2", "likes cake", type="preference", importance=0.5, tags=[], sourceKind="implicit_inference"
    )
    storage = SqlMemoryStorage(sql_url)
    _save(storage, plain, at_defaults)
    loaded = _cold(sql_url)["facts"]
    assert json.dumps(loaded[0]) == json.dumps(plain)
    assert loaded[1] == at_defaults  # the same keys and values (PostgreSQL's JSONB orders the keys)
    with get_engine(sql_url).connect() as conn:
        assert conn.execute(
            select(facts_table.c.memory_type).order_by(facts_table.c.fact_id)
        ).scalars().all() == [
            "preference",
            "preference",
        ]


def test_invalid_record_values_are_kept_verbatim_never_in_a_column(sql_url: str) -> None:
    odd = _fact("f1", "likes tea", importance="very", type="gossip", tags="tea", relations=[{"to": "x"}])
    storage = SqlMemoryStorage(sql_url)
    _save(storage, odd)
    assert _cold(sql_url)["facts"] == [odd]
    with get_engine(sql_url).connect() as conn:
        row = conn.execute(select(facts_table.c.memory_type, facts_table.c.importance)).one()
        assert tuple(row) == ("preference", 0.5)
        assert conn.execute(select(tags_table.c.tag)).all() == []


def test_every_change_is_a_new_version_and_the_history_holds_each(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    _save(storage, _fact("f1", "likes tea"))
    for importance in (0.6, 0.7):
        document = storage.load(None, user_id="alice")
        document["facts"][0]["importance"] = importance
        assert storage.save(document, None, user_id="alice")
    unchanged = storage.load(None, user_id="alice")
    assert storage.save(unchanged, None, user_id="alice")  # no change: no new version
    with get_engine(sql_url).connect() as conn:
        assert conn.execute(select(facts_table.c.version)).scalar_one() == 3
        history = conn.execute(
            select(history_table.c.action, history_table.c.version, history_table.c.after)
            .where(history_table.c.entity == "fact")
            .order_by(history_table.c.id)
        ).all()
    assert [(action, version) for action, version, _ in history] == [
        ("insert", 1),
        ("update", 2),
        ("update", 3),
    ]
    assert [after.get("importance") for _, _, after in history] == [None, 0.6, 0.7]


def test_a_relation_to_a_fact_the_scope_lacks_is_dropped_and_logged(
    sql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    storage = SqlMemoryStorage(sql_url)
    relations = [{"type": "related_to", "target": "nowhere"}, {"type": "related_to", "target": "f1"}]
    with caplog.at_level(logging.WARNING):
        _save(storage, _fact("f1", "likes tea"), _fact("f2", "likes cake", relations=relations))
    assert "1 relation target(s) name no fact of this scope" in caplog.text
    expected = [{"type": "related_to", "target": "f1"}]
    assert storage.load(None, user_id="alice")["facts"][1]["relations"] == expected  # not the cached guess
    assert _cold(sql_url)["facts"][1]["relations"] == expected
    # Dropped before planning: saving the same relation again is no change, no version, no audit row.
    document = storage.load(None, user_id="alice")
    document["facts"][1]["relations"] = relations
    assert storage.save(document, None, user_id="alice")
    with get_engine(sql_url).connect() as conn:
        assert (
            conn.execute(select(facts_table.c.version).where(facts_table.c.fact_id == "f2")).scalar_one() == 1
        )
        afters = conn.execute(
            select(history_table.c.after).where(history_table.c.entity_id == "f2")
        ).scalars()
        assert [after["relations"] for after in afters] == [expected]


def test_another_users_fact_is_no_relation_target(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    _save(storage, _fact("bobs", "bob likes jazz"), user="bob")
    _save(storage, _fact("f1", "likes tea", relations=[{"type": "contradicts", "target": "bobs"}]))
    assert "relations" not in _cold(sql_url)["facts"][0]
    with get_engine(sql_url).connect() as conn:
        assert conn.execute(select(relations_table.c.fact_id)).all() == []


def test_a_deleted_fact_takes_its_tags_and_outgoing_relations_but_stays_a_target(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    _save(
        storage,
        _fact("f1", "likes tea", tags=["tea"]),
        _fact("f2", "likes green tea", tags=["tea"], relations=[{"type": "related_to", "target": "f1"}]),
        _fact("f3", "likes matcha", relations=[{"type": "derived_from", "target": "f2"}]),
    )
    document = storage.load(None, user_id="alice")
    document["facts"] = [fact for fact in document["facts"] if fact["id"] != "f2"]
    assert storage.save(document, None, user_id="alice")
    with get_engine(sql_url).connect() as conn:
        tagged = (
            conn.execute(
                select(facts_table.c.fact_id).join(tags_table, tags_table.c.fact_row_id == facts_table.c.id)
            )
            .scalars()
            .all()
        )
        relations = conn.execute(select(relations_table.c.fact_id, relations_table.c.target_fact_id)).all()
    assert tagged == ["f1"]
    assert relations == [("f3", "f2")]  # f2's own relation went with it; the one naming it stays
    assert _cold(sql_url)["facts"][1]["relations"] == [{"type": "derived_from", "target": "f2"}]


def test_erase_removes_tags_and_relations(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    _save(
        storage,
        _fact("f1", "likes tea", tags=["tea"]),
        _fact("f2", "x", relations=[{"type": "related_to", "target": "f1"}]),
    )
    _save(storage, _fact("b1", "bob likes jazz", tags=["music"]), user="bob")
    counts = erase_user(get_engine(sql_url), "alice", datetime.now(UTC))
    assert counts["memory_fact_tags"] == 1 and counts["memory_fact_relations"] == 1
    with get_engine(sql_url).connect() as conn:
        assert conn.execute(select(tags_table.c.tag)).scalars().all() == ["music"]
        assert conn.execute(select(relations_table.c.fact_id)).all() == []


def test_revision_0009_gives_existing_facts_the_documented_defaults_and_goes_back_down(sql_url: str) -> None:
    upgrade(sql_url, "0008")
    downgrade(sql_url, "0008")  # a PostgreSQL test database starts at head
    now = datetime.now(UTC)
    categories = ("preference", "knowledge", "context", "behavior", "goal", "correction", "custom")
    with get_engine(sql_url).begin() as conn:
        scope_id = conn.execute(
            insert(scopes_table).values(user_id="alice", revision=1).returning(scopes_table.c.id)
        ).scalar_one()
        for index, category in enumerate(categories):
            conn.execute(
                insert(facts_table).values(  # only the columns 0008 has
                    {
                        "scope_id": scope_id, "fact_id": f"f{index}", "position": index,
                        "content": category, "content_key": category, "category": category,
                        "confidence": 0.9, "extra": {}, "added_revision": 1, "updated_revision": 1,
                        "created_at": now,
                    }
                )
            )  # fmt: skip
    upgrade(sql_url)
    with get_engine(sql_url).connect() as conn:
        rows = conn.execute(
            text(
                "SELECT category, memory_type, importance, source_kind, raw, structured, version "
                "FROM memory_facts"
            )
        ).all()
    assert {row[0]: row[1] for row in rows} == {
        "preference": "preference",
        "knowledge": "semantic",
        "context": "episodic",
        "behavior": "procedural",
        "goal": "profile",
        "correction": "semantic",
        "custom": "semantic",
    }
    assert {tuple(row[2:]) for row in rows} == {(0.5, "implicit_inference", None, None, 1)}
    # The documents read exactly as they did under 0008: every value is the default.
    assert all(
        set(fact) == {"id", "content", "category", "confidence", "createdAt"}
        for fact in _cold(sql_url)["facts"]
    )
    dispose_engines()
    downgrade(sql_url, "0008")  # nothing but defaults: goes down
    upgrade(sql_url)
    _save(SqlMemoryStorage(sql_url), _fact("f9", "likes tea", importance=0.9))
    dispose_engines()
    with pytest.raises(Exception, match="record fields"):  # RuntimeError; PostgreSQL's RAISE
        downgrade(sql_url, "0008")
    dispose_engines()
    assert _cold(sql_url)["facts"][-1]["importance"] == 0.9


def test_vacuum_keeps_a_deleted_fact_that_a_relation_names(sql_url: str) -> None:
    storage = SqlMemoryStorage(sql_url)
    _save(storage, _fact("f_old", "drinks coffee"), _fact("f_other", "likes cake"))
    document = storage.load(None, user_id="alice")
    document["facts"] = [_fact("f_new", "drinks tea", relations=[{"type": "supersedes", "target": "f_old"}])]
    assert storage.save(document, None, user_id="alice")  # f_old and f_other deleted
    purged = vacuum(get_engine(sql_url), datetime.now(UTC) + timedelta(days=1))
    assert purged["memory_facts"] == 1  # f_other; f_old is still a relation's target
    expected = [{"type": "supersedes", "target": "f_old"}]
    assert storage.load(None, user_id="alice")["facts"][0]["relations"] == expected
    assert _cold(sql_url)["facts"][0]["relations"] == expected


def test_structured_numbers_and_text_come_back_exactly(sql_url: str) -> None:
    # JSONB would turn 1e16 into an integer and -0.0 into 0; the typed text \u0000 is no NUL.
    structured = {"big": 1e16, "negative_zero": -0.0, "tiny": 5e-324, "path": "C:\\u0000dir"}
    assert checked_structured(structured) == structured
    storage = SqlMemoryStorage(sql_url)
    _save(storage, _fact("f1", "likes tea", structured=structured))
    loaded = _cold(sql_url)["facts"][0]["structured"]
    assert json.dumps(loaded) == json.dumps(structured)
    assert math.copysign(1.0, loaded["negative_zero"]) == -1.0
