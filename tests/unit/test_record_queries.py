"""The memory-record fields on the query surface and in manual edits, without storage (issue 32)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import get_args

import pytest

from memstore.config import MemoryConfig
from memstore.errors import InvalidFactError, QueryError
from memstore.ops.record_fields import MemoryType, RecordFields, SourceKind
from memstore.record import MEMORY_TYPES, SOURCE_KINDS, checked_tag
from memstore.retention import RetentionPolicy
from memstore.storage.records import FactFilter, FactRecord, FactRelations, Relation, with_scores

NOW = datetime(2026, 7, 1, tzinfo=UTC)


def _record(**fields: object) -> FactRecord:
    base: dict[str, object] = {
        "user_id": "alice",
        "agent_name": None,
        "fact_id": "fact_1",
        "content": "Alice drinks tea",
        "category": "preference",
        "confidence": 0.9,
        "created_at": NOW - timedelta(days=60),
        "source": "thread-1",
    }
    return FactRecord(**{**base, **fields})  # type: ignore[arg-type]


def test_the_schema_literals_are_the_record_constants() -> None:
    assert get_args(MemoryType) == MEMORY_TYPES
    assert get_args(SourceKind) == SOURCE_KINDS


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"memory_type": "habit"}, "memory_type must be one of episodic"),
        ({"source_kind": "guess"}, "source_kind must be one of explicit_user_input"),
        ({"min_importance": 1.5}, "min_importance must be between 0 and 1"),
        ({"min_importance": float("nan")}, "min_importance must be between 0 and 1"),
        ({"min_importance": True}, "min_importance must be between 0 and 1"),
        ({"tag": "a,b"}, "tag: each tag must be 1 to 64 printable characters without a comma"),
        ({"tag": "  "}, "tag: each tag must be"),
        ({"fact_id": ""}, "fact_id must be an id of 1 to 64 characters"),
    ],
)
def test_a_bad_record_filter_is_a_query_error_that_names_it(fields: dict[str, object], message: str) -> None:
    with pytest.raises(QueryError, match=message):
        FactFilter(**fields)  # type: ignore[arg-type]


def test_a_tag_filter_is_stripped_like_a_stored_tag() -> None:
    assert FactFilter(tag="  work ").tag == "work"
    assert FactFilter(min_importance=1).min_importance == 1


def test_a_record_defaults_to_the_documented_values_and_serialises_tags_as_a_list() -> None:
    record = _record(tags=("b", "a"))
    assert (record.memory_type, record.importance, record.source_kind, record.version) == (
        "semantic",
        0.5,
        "implicit_inference",
        1,
    )
    data = record.to_json()
    assert data["tags"] == ["b", "a"] and data["raw"] is None and data["decay"] is None


def test_with_scores_fills_decay_and_importance_stretches_it() -> None:
    policy = RetentionPolicy.of(MemoryConfig())
    plain, important = with_scores([_record(), _record(importance=1.0)], policy, NOW)
    assert plain.decay is not None and important.decay is not None
    assert 0 < plain.decay < important.decay <= 0.9
    assert plain.score == important.score  # eviction does not read importance
    expected = round(policy.decay(_record().candidate(), NOW).value, 6)
    assert plain.decay == expected


def test_relations_serialise_both_ways() -> None:
    relations = FactRelations(
        "f1", [Relation("supersedes", "f0", live=False)], [Relation("related_to", "f2")]
    )
    assert relations.to_json() == {
        "fact_id": "f1",
        "outgoing": [{"kind": "supersedes", "target": "f0", "live": False}],
        "incoming": [{"kind": "related_to", "source": "f2", "live": True}],
    }


def test_record_fields_are_checked_and_named_by_their_parameter() -> None:
    with pytest.raises(InvalidFactError) as caught:
        RecordFields.of(source_kind="guess")
    assert caught.value.field == "source_kind" and str(caught.value).startswith("source_kind: must be one of")
    with pytest.raises(InvalidFactError, match=r"^memory_type: "):
        RecordFields.of(memory_type="habit")
    with pytest.raises(InvalidFactError, match=r"^tags: must be a list of text"):
        RecordFields.of(tags="work")
    with pytest.raises(InvalidFactError, match=r"^importance: must be between 0 and 1"):
        RecordFields.of(importance=2)
    with pytest.raises(InvalidFactError, match=r"^structured: nests deeper than 4 levels"):
        RecordFields.of(structured={"a": {"b": {"c": {"d": {"e": 1}}}}})
    with pytest.raises(InvalidFactError, match=r"^raw: 4,001 characters"):
        RecordFields.of(raw="x" * 4001)


def test_record_fields_at_their_default_leave_no_key() -> None:
    fact = {"id": "f", "content": "x", "category": "preference", "importance": 0.9, "tags": ["a"], "raw": "r"}
    cleared = RecordFields.of(
        memory_type="preference",
        importance=0.5,
        tags=[],
        source_kind="implicit_inference",
        raw="",
        structured={},
    )
    assert cleared.applied_to(fact) == {"id": "f", "content": "x", "category": "preference"}
    assert cleared.held_by({"category": "preference"})
    assert not cleared.held_by(fact)


def test_record_fields_set_values_and_sort_tags() -> None:
    fields = RecordFields.of(memory_type="episodic", importance=0.8, tags=["b", " a "], structured={"k": [1]})
    applied = fields.applied_to({"id": "f", "category": "preference"})
    assert applied == {
        "id": "f",
        "category": "preference",
        "type": "episodic",
        "importance": 0.8,
        "tags": ["a", "b"],
        "structured": {"k": [1]},
    }
    assert fields.held_by(applied)
    assert RecordFields.of().applied_to({"id": "f"}) == {"id": "f"}


@pytest.mark.parametrize("tag", ["a\u009b31m", "a\u202eb", "a\u2028b", "a\u200bb"])
def test_a_tag_holds_no_control_or_format_character(tag: str) -> None:
    """An 8-bit CSI, a bidi override or a line separator would reach terminals through --json."""
    with pytest.raises(InvalidFactError, match="tags"):
        checked_tag(tag)
    assert checked_tag(" 标签 ") == "标签"
