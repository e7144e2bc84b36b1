"""The one-statement cold load builds exactly the document the codec decodes from the rows (issue 19).

The oracle reads the scope's live rows with plain SQLAlchemy and decodes each with
``codec.decode_fact``/``decode_section``, the path every save's round trip is tested against. The
comparison is of JSON text, so key order and ``1`` versus ``1.0`` count. Scopes are random: unicode
and line separators, unknown keys (nested, big integers), odd confidences (ints, bools, values
whose every bit matters), odd or missing timestamps, missing sections, tombstones and 500 facts.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from memstore.document import HISTORY_SECTIONS, SECTION_GROUPS, USER_SECTIONS, as_utc, format_timestamp
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.documents.codec import (
    EMPTY_SECTION,
    FactValues,
    SectionValues,
    decode_fact,
    decode_section,
)
from memstore.storage.sql.documents.json_values import json_object
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.schema.models import facts_table, scopes_table, sections_table

_TEXT = [
    "plain",
    "中文记忆",
    "émoji 🧠",
    "line\nbreak",
    "sep\u2028par\u2029",
    'quote "x" \\ y',
    "tab\tend",
    "ש",
]
_STAMPS: list[Any] = [
    "2026-07-14T15:35:46Z",
    "2026-07-14T15:35:46.123456Z",
    "2026-07-14T15:35:46.100000Z",
    "2026-07-14T17:35:46+02:00",
    "2026-07-14",
    "not a time",
    None,
    1_700_000_000,
]
_EXTRA: list[Any] = [{"a": [1, {"b": None}]}, 2**70, -0.0, True, None, "x\u2028y", 1.5e-300, []]


def _confidence(rng: random.Random) -> Any:
    return rng.choice(
        [
            round(rng.random(), 2),
            rng.random(),  # every bit set: beyond SQLite's 15-digit JSON
            rng.random() / 1000,  # below 1/256: not a whole multiple of 2**-60
            0.1 + 0.2,
            0,
            1,
            1.0,
            True,
            "0.7",
            None,
            5e-324,
        ]
    )


def _fact(rng: random.Random, index: int) -> dict[str, Any]:
    fact: dict[str, Any] = {
        "id": f"f{index}-{rng.choice(_TEXT)[:2]}",
        "content": f"{rng.choice(_TEXT)} {index} {rng.choice(_TEXT)}",
        "category": rng.choice(["preference", "knowledge", "context", "correction", "x" * 80, 7]),
        "confidence": _confidence(rng),
    }
    stamp = rng.choice(_STAMPS)
    if stamp is not None:
        fact["createdAt"] = stamp
    if rng.random() < 0.7:
        fact["source"] = rng.choice(["thread-1", "线程", 42, None])
    if rng.random() < 0.2:
        fact["sourceError"] = rng.choice(["was wrong", "错"])
    if rng.random() < 0.3:
        fact[rng.choice(["topics", "weird key", "$memstore", "nested"])] = rng.choice(_EXTRA)
    if rng.random() < 0.1:
        del fact["category"]
    return fact


def _document(rng: random.Random, facts: int) -> dict[str, Any]:
    document: dict[str, Any] = {"version": "1.0", "facts": [_fact(rng, i) for i in range(facts)]}
    for group, names in SECTION_GROUPS.items():
        present = [name for name in names if rng.random() < 0.6]  # the rest: no row at all
        document[group] = {
            name: {"summary": rng.choice(_TEXT), "updatedAt": rng.choice(_STAMPS)}
            | ({"note": rng.choice(_EXTRA)} if rng.random() < 0.3 else {})
            for name in present
        }
    return document


def _oracle(engine: Engine, user: str, agent: str | None) -> dict[str, Any]:
    """The document from the rows, decoded value by value by the codec."""
    with engine.connect() as conn:
        scope = conn.execute(
            select(scopes_table).where(
                scopes_table.c.user_id == user,
                scopes_table.c.agent_name.is_(None) if agent is None else scopes_table.c.agent_name == agent,
            )
        ).one()
        facts = conn.execute(
            select(facts_table)
            .where(facts_table.c.scope_id == scope.id, facts_table.c.deleted_revision.is_(None))
            .order_by(facts_table.c.position, facts_table.c.fact_id)
        ).all()
        sections = conn.execute(select(sections_table).where(sections_table.c.scope_id == scope.id)).all()
    stored = {
        row.section: SectionValues(row.summary, as_utc(row.updated_at), json_object(row.extra))
        for row in sections
    }
    created = as_utc(scope.created_at)
    return {
        "version": scope.version,
        "lastUpdated": format_timestamp(scope.updated_at),
        "revision": scope.revision,
        "incarnation": f"{scope.id}@{created.isoformat()}",
        "user": {name: decode_section(stored.get(name, EMPTY_SECTION)) for name in USER_SECTIONS},
        "history": {name: decode_section(stored.get(name, EMPTY_SECTION)) for name in HISTORY_SECTIONS},
        "facts": [
            decode_fact(
                FactValues(
                    row.fact_id,
                    row.content,
                    row.category,
                    row.confidence,
                    as_utc(row.created_at),
                    row.source,
                    row.source_error,
                    json_object(row.extra),
                )
            )
            for row in facts
        ],
    }


def _same(loaded: dict[str, Any], expected: dict[str, Any]) -> None:
    assert json.dumps(loaded, ensure_ascii=False) == json.dumps(expected, ensure_ascii=False)


@pytest.mark.parametrize("seed", range(12))
def test_a_cold_load_is_the_codec_decoding_of_the_rows(sql_url: str, seed: int) -> None:
    rng = random.Random(seed)
    writer = SqlMemoryStorage(sql_url)
    agent = rng.choice([None, "coder", "Writer-2"])
    size = rng.choice([0, 1, 7, 60, 500]) if seed else 500
    assert writer.save(_document(rng, size), agent, user_id="alice")
    if size:  # tombstones and moves: drop some facts, shuffle the rest, add a few
        document = writer.load(agent, user_id="alice")
        kept = [fact for fact in document["facts"] if rng.random() < 0.7]
        rng.shuffle(kept)
        document["facts"] = kept + [_fact(rng, size + i) for i in range(3)]
        assert writer.save(document, agent, user_id="alice")
    assert writer.save(_document(rng, 3), agent, user_id="bob")  # another scope, never read here

    reader = SqlMemoryStorage(sql_url)
    expected = _oracle(get_engine(sql_url), "alice", agent and agent.lower())
    _same(reader.reload(agent, user_id="alice"), expected)
    _same(reader.load(agent, user_id="alice"), expected)  # the cached copy


def _plain_fact(index: int) -> dict[str, Any]:
    stamp = "2026-07-14T15:35:46Z"
    return {
        "id": f"f{index}",
        "content": f"fact {index}",
        "category": "context",
        "confidence": 0.5,
        "createdAt": stamp,
    }


def test_rows_a_dba_wrote_by_hand_load_as_the_codec_reads_them(sql_url: str) -> None:
    """Stamps in other shapes and a confidence with every bit set, written with plain SQL."""
    storage = SqlMemoryStorage(sql_url)
    doc = {"facts": [_plain_fact(i) for i in range(7)]}
    assert storage.save(doc, user_id="alice")
    engine = get_engine(sql_url)
    with engine.connect() as conn:  # every column says what the document says: no ``extra``
        assert all(
            extra in ("{}", {}) for extra in conn.execute(text("SELECT extra FROM memory_facts")).scalars()
        )
    tiny = 0.00123456789012345678
    with engine.begin() as conn:
        conn.execute(text("UPDATE memory_facts SET confidence = :c WHERE fact_id = 'f0'"), {"c": tiny})
        conn.execute(text("UPDATE memory_facts SET created_at = NULL WHERE fact_id = 'f1'"))
        stamp = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC) + timedelta(hours=1)
        conn.execute(text("UPDATE memory_facts SET created_at = :t WHERE fact_id = 'f2'"), {"t": stamp})
        if engine.dialect.name == "sqlite":
            for fact_id, stamp_text in (("f3", "2026-01-02T03:04:05Z"), ("f4", "2026-W01-4T00:00:00.123456")):
                conn.execute(
                    text("UPDATE memory_facts SET created_at = :t WHERE fact_id = :f"),
                    {"t": stamp_text, "f": fact_id},
                )
            conn.execute(text("UPDATE memory_facts SET extra = 5 WHERE fact_id = 'f5'"))  # numeric affinity
            conn.execute(text("UPDATE memory_sections SET extra = 7"))
        else:
            conn.execute(text("UPDATE memory_facts SET confidence = '-0'::float8 WHERE fact_id = 'f6'"))
        # The save's derived snapshot says what the rows said before: a hand edit moves the
        # revision, as docs/schema.md asks, so the load reads the rows.
        conn.execute(text("UPDATE memory_scopes SET revision = revision + 1"))
    loaded = SqlMemoryStorage(sql_url).reload(user_id="alice")
    _same(loaded, _oracle(engine, "alice", None))
    assert loaded["facts"][0]["confidence"] == tiny
    if engine.dialect.name == "sqlite":
        assert loaded["facts"][4]["createdAt"] == "2026-01-01T00:00:00.123456Z"  # the week date, read
    else:
        assert str(loaded["facts"][6]["confidence"]) == "-0.0"


def test_the_snapshot_a_save_builds_from_a_cold_load_holds_the_stored_values(sql_url: str) -> None:
    """A cold load defers the snapshot; the fast path then saves exactly what a full merge would."""
    rng = random.Random(7)
    writer = SqlMemoryStorage(sql_url)
    assert writer.save(_document(rng, 60), user_id="alice")
    fast, full = SqlMemoryStorage(sql_url), SqlMemoryStorage(sql_url)
    document = fast.reload(user_id="alice")
    document["facts"][3]["content"] = "edited after a cold load"
    del document["facts"][5]
    assert fast.save(document, user_id="alice")
    after_fast = full.reload(user_id="alice")
    assert after_fast["facts"][3]["content"] == "edited after a cold load"
    assert len(after_fast["facts"]) == 59
    _same(after_fast, _oracle(get_engine(sql_url), "alice", None))
