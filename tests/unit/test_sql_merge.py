"""The SQL provider's pure parts: the lossless codec and the merge planner."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memstore.config import MemoryConfig
from memstore.document import format_timestamp
from memstore.errors import MalformedDocumentError
from memstore.retention import FactSignals, RetentionPolicy
from memstore.storage.sql.documents.codec import (
    FactValues,
    KnownFact,
    SectionValues,
    decode_fact,
    decode_section,
    encode_fact,
    encode_section,
    parse_document,
)
from memstore.storage.sql.documents.merge import (
    Cap,
    MergePlan,
    StoredFact,
    StoredSection,
    plan_merge,
)
from memstore.storage.sql.documents.merge import (
    assign_positions as _assign_positions,
)

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)

# --- codec -----------------------------------------------------------------------------------------

# Text every dialect stores: no NUL (PostgreSQL refuses it; the codec refuses it for both).
storable = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]))
json_leaf = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | storable
)
json_value = st.recursive(
    json_leaf, lambda inner: st.lists(inner) | st.dictionaries(storable, inner), max_leaves=8
)
timestamp_like = st.sampled_from(
    ["2026-07-14T15:35:46.123456Z", "2026-07-14T15:35:46Z", "2026-07-14", "2026-07-14T15:35:46+08:00", ""]
)
fact_field = st.one_of(json_value, timestamp_like)


@given(
    content=storable.filter(str.strip),
    known=st.fixed_dictionaries(
        {},
        optional={
            "category": fact_field,
            "confidence": st.floats(0, 1) | st.integers(0, 1),
            "createdAt": fact_field,
            "source": fact_field,
            "sourceError": fact_field,
            "$memstore": json_value,
        },
    ),
    unknown=st.dictionaries(
        storable.filter(lambda key: key not in {"id", "content"}), json_value, max_size=3
    ),
)
def test_any_fact_decodes_to_exactly_what_was_encoded(
    content: str, known: dict[str, Any], unknown: dict[str, Any]
) -> None:
    fact = {**unknown, "id": "fact_00000001", "content": content, **known}
    decoded = decode_fact(encode_fact(fact, "fact_00000001"))
    assert json.dumps(decoded, sort_keys=True) == json.dumps(fact, sort_keys=True)


@given(
    st.fixed_dictionaries({}, optional={"summary": fact_field, "updatedAt": fact_field, "note": json_value})
)
def test_any_section_decodes_to_exactly_what_was_encoded(section: dict[str, Any]) -> None:
    decoded = decode_section(encode_section(section))
    assert json.dumps(decoded, sort_keys=True) == json.dumps(section, sort_keys=True)


@pytest.mark.parametrize(
    "fact",
    [
        {"content": "a\x00b"},
        {"content": "ok", "category": "c\x00"},
        {"content": "ok", "note": "x\x00y"},
        {"content": "ok", "note": {"k\x00": 1}},
        {"content": "ok", "note": ["\\", "\x00"]},
    ],
)
def test_text_no_dialect_can_store_is_refused_before_any_sql(fact: dict[str, Any]) -> None:
    with pytest.raises(MalformedDocumentError, match="NUL"):
        encode_fact(fact, "fact_00000001")


def test_an_escaped_backslash_before_u0000_is_not_a_nul() -> None:
    assert encode_fact({"content": "ok", "note": "\\u0000"}, "fact_00000001").extra["note"] == "\\u0000"


def test_known_values_use_real_columns() -> None:
    values = encode_fact(
        {"content": "x", "category": "goal", "confidence": 0.7, "createdAt": "2026-07-14T15:35:46+08:00"},
        "fact_00000001",
    )
    assert (values.category, values.confidence, values.source) == ("goal", 0.7, None)
    assert values.created_at is not None and values.created_at.isoformat() == "2026-07-14T07:35:46+00:00"
    assert values.extra == {"$memstore": {"raw": {"createdAt": "2026-07-14T15:35:46+08:00"}}}


# --- merge -----------------------------------------------------------------------------------------


def _values(
    fact_id: str, content: str, confidence: float = 0.8, created_at: datetime | None = None
) -> FactValues:
    fact: dict[str, Any] = {"content": content, "confidence": confidence, "category": "context"}
    if created_at is not None:
        fact["createdAt"] = format_timestamp(created_at)
    return encode_fact(fact, fact_id)


def _row(
    row_id: int,
    content: str,
    *,
    added: int = 1,
    updated: int | None = None,
    deleted: int | None = None,
    confidence: float = 0.8,
    created_at: datetime | None = None,
    confirmed_at: datetime | None = None,
    accessed: tuple[datetime, int] | None = None,
) -> StoredFact:
    return StoredFact(
        row_id=row_id,
        values=_values(f"fact_{row_id:08x}", content, confidence, created_at),
        position=row_id,
        added_revision=added,
        updated_revision=updated if updated is not None else added,
        deleted_revision=deleted,
        signals=FactSignals(confirmed_at, *(accessed or (None, 0))),
    )


def _doc_fact(fact_id: int, content: str, confidence: float = 0.8) -> dict[str, Any]:
    return {"id": f"fact_{fact_id:08x}", "content": content, "category": "context", "confidence": confidence}


def _plan(
    facts: list[dict[str, Any]] | None,
    stored: list[StoredFact],
    *,
    revision: int | None,
    current: int,
    sections: dict[str, StoredSection] | None = None,
    user: dict[str, Any] | None = None,
    max_facts: int = 100,
    policy: Literal["hybrid", "confidence"] = "confidence",
    now: datetime = NOW,
) -> MergePlan:
    document: dict[str, Any] = {} if revision is None else {"revision": revision}
    if facts is not None:
        document["facts"] = facts
    if user is not None:
        document["user"] = user
    ids = (f"fact_{n:08x}" for n in itertools.count(0xF000))
    return plan_merge(
        parse_document(document),
        stored_facts=stored,
        stored_sections=sections or {},
        stored_version="1.0",
        current=current,
        cap=Cap(max_facts, RetentionPolicy.of(MemoryConfig(eviction_policy=policy)), now),
        new_id=lambda: next(ids),
    )


def _contents(plan: MergePlan) -> list[str]:
    return [values.content for values in plan.facts]


def test_a_current_document_replaces_facts_and_order() -> None:
    stored = [_row(1, "one"), _row(2, "two"), _row(3, "three")]
    plan = _plan(
        [_doc_fact(3, "three"), _doc_fact(1, "one"), _doc_fact(4, "four")], stored, revision=1, current=1
    )
    assert _contents(plan) == ["three", "one", "four"]
    assert plan.tombstones == ["fact_00000002"]
    assert [values.fact_id for values, _ in plan.inserts] == ["fact_00000004"]
    assert plan.revision == 2


def test_a_stale_document_keeps_concurrent_adds_and_deletes() -> None:
    stored = [
        _row(1, "seen and kept"),
        _row(2, "deleted by caller"),
        _row(3, "added concurrently", added=3),
        _row(4, "deleted concurrently", deleted=3),
    ]
    document = [_doc_fact(1, "seen and kept"), _doc_fact(4, "deleted concurrently"), _doc_fact(9, "new")]
    plan = _plan(document, stored, revision=2, current=3)
    assert _contents(plan) == ["seen and kept", "added concurrently", "new"]
    assert plan.tombstones == ["fact_00000002"]
    assert [values.fact_id for values, _ in plan.inserts] == ["fact_00000009"]  # fact 4 stays deleted


def test_first_committer_wins_per_fact() -> None:
    stored = [_row(1, "edited concurrently", updated=3), _row(2, "untouched")]
    document = [_doc_fact(1, "caller's edit"), _doc_fact(2, "caller's other edit")]
    plan = _plan(document, stored, revision=2, current=3)
    assert _contents(plan) == ["edited concurrently", "caller's other edit"]
    assert [values.fact_id for values, _ in plan.updates] == ["fact_00000002"]


def test_a_fact_deleted_before_the_callers_revision_is_revived() -> None:
    plan = _plan([_doc_fact(1, "back again")], [_row(1, "back again", deleted=2)], revision=None, current=5)
    # Written like a new fact: the insert upserts over the tombstoned row.
    assert [values.fact_id for values, _ in plan.inserts] == ["fact_00000001"]
    assert plan.changes[0].action == "insert"


def test_content_keys_stay_unique() -> None:
    stored = [_row(1, "Likes tea", added=3)]
    document = [_doc_fact(7, "  likes TEA "), _doc_fact(8, "new"), _doc_fact(9, "NEW")]
    plan = _plan(document, stored, revision=2, current=3)
    assert _contents(plan) == ["Likes tea", "new"]


def test_an_edit_that_would_duplicate_another_fact_is_not_applied() -> None:
    stored = [_row(1, "alpha"), _row(2, "beta")]
    plan = _plan([_doc_fact(1, "alpha"), _doc_fact(2, "ALPHA")], stored, revision=1, current=1)
    assert _contents(plan) == ["alpha", "beta"]
    assert not plan.updates


def test_the_cap_drops_lowest_confidence_and_later_ties() -> None:
    stored = [_row(1, "a", confidence=0.5), _row(2, "b", confidence=0.9), _row(3, "c", confidence=0.5)]
    document = [
        _doc_fact(1, "a", 0.5),
        _doc_fact(2, "b", 0.9),
        _doc_fact(3, "c", 0.5),
        _doc_fact(4, "d", 0.5),
        _doc_fact(5, "e", 0.95),
    ]
    plan = _plan(document, stored, revision=1, current=1, max_facts=3)
    assert _contents(plan) == ["a", "b", "e"]
    assert plan.tombstones == ["fact_00000003"]
    assert [values.content for values, _ in plan.inserts] == ["e"]


def test_the_hybrid_cap_evicts_the_stale_unused_fact_and_records_its_score() -> None:
    old = NOW - timedelta(days=400)
    stored = [
        _row(1, "old and forgotten", confidence=0.8, created_at=old),
        _row(2, "recently confirmed", confidence=0.75, created_at=old, confirmed_at=NOW),
        _row(3, "often used", confidence=0.7, created_at=old, accessed=(NOW, 6)),
    ]
    # Only a save that adds facts evicts: this one adds a new fact, one over the cap.
    document = [*(decode_fact(row.values) for row in stored), _doc_fact(4, "new", 0.95)]
    plan = _plan(document, stored, revision=1, current=1, max_facts=3, policy="hybrid")
    assert _contents(plan) == ["recently confirmed", "often used", "new"]
    assert plan.tombstones == ["fact_00000001"]
    detail = plan.removal_detail["fact_00000001"]
    assert detail["reason"] == "evicted" and detail["policy"] == "hybrid" and detail["max_facts"] == 3
    assert detail["confidence"] == 0.8 and detail["heat"] == 0.0
    assert detail["score"] < 0.65 * 0.75 + 0.25  # below the confirmed fact's score
    [change] = [change for change in plan.changes if change.action == "delete"]
    assert change.detail == detail
    confidence_only = _plan(document, stored, revision=1, current=1, max_facts=3)
    assert _contents(confidence_only) == ["old and forgotten", "recently confirmed", "new"]
    without_adding = _plan(document[:3], stored, revision=1, current=1, max_facts=2, policy="hybrid")
    assert not without_adding.tombstones and len(_contents(without_adding)) == 3


def test_a_revived_fact_is_ranked_afresh_not_by_its_tombstones_signals() -> None:
    old = NOW - timedelta(days=400)
    stored = [
        _row(1, "revived", confidence=0.7, created_at=old, deleted=1, accessed=(NOW, 8)),
        _row(2, "live", confidence=0.7, created_at=old, added=1),
    ]
    document = [decode_fact(stored[1].values), decode_fact(stored[0].values)]
    plan = _plan(document, stored, revision=2, current=2, max_facts=1, policy="hybrid")
    # Equal scores without signals: the stored fact ranks first, and the revival is dropped.
    assert _contents(plan) == ["live"] and not plan.tombstones


def test_without_facts_nothing_is_deleted() -> None:
    plan = _plan(None, [_row(1, "kept")], revision=None, current=1)
    assert _contents(plan) == ["kept"]
    assert not plan.changed


def test_sections_take_the_callers_value_unless_changed_concurrently() -> None:
    sections = {
        "workContext": StoredSection(SectionValues("old work", None, {}), revision=3),
        "topOfMind": StoredSection(SectionValues("old mind", None, {}), revision=1),
    }
    user = {
        "workContext": {"summary": "caller's work", "updatedAt": ""},
        "topOfMind": {"summary": "caller's mind", "updatedAt": ""},
        "personalContext": {"summary": "", "updatedAt": ""},
    }
    plan = _plan(None, [], revision=2, current=3, sections=sections, user=user)
    assert [name for name, _ in plan.section_updates] == ["topOfMind"]
    assert not plan.section_inserts  # an empty section equals a missing row
    assert plan.sections["workContext"].summary == "old work"


def test_positions_only_change_where_order_breaks() -> None:
    assert _assign_positions([1, 2, 3]) == [1, 2, 3]
    assert _assign_positions([2, 3, None]) == [2, 3, 4]  # deleted the first, appended one
    assert _assign_positions([None, None, 5, 6]) == [3, 4, 5, 6]  # prepended two
    assert _assign_positions([3, 1, 2]) == [3, 4, 5]
    assert _assign_positions([None, None]) == [0, 1]


def _positions_by_definition(current: list[int | None]) -> list[int]:
    """Walk left to right: keep a stored position if it still sorts after the last one, else take the next."""
    first = next((index for index, position in enumerate(current) if position is not None), None)
    last = (0 if first is None else (current[first] or 0) - first) - 1
    positions = []
    for position in current:
        last = position if position is not None and position > last else last + 1
        positions.append(last)
    return positions


@given(st.lists(st.none() | st.integers(-5, 30), max_size=12))
def test_the_shortcut_for_appends_assigns_the_positions_the_definition_does(
    current: list[int | None],
) -> None:
    positions = _assign_positions(current)
    assert positions == _positions_by_definition(current)
    assert all(a < b for a, b in itertools.pairwise(positions))


def test_a_document_equal_to_the_stored_facts_under_equals_but_retyped_is_parsed_again() -> None:
    """1, 1.0 and True are ``==``: the bulk comparison of unchanged facts must still see the retyping."""
    stored = parse_document(
        {"facts": [{"id": "a", "content": "x", "confidence": 1}, {"id": "b", "content": "y"}]}
    )
    assert stored.facts is not None
    known = {fact.values.fact_id: KnownFact.of(fact.values) for fact in stored.facts}
    same = parse_document(
        {"facts": [dict(entry.raw) for entry in known.values()] + [{"content": "new"}]}, known
    )
    assert same.facts is not None and [
        fact is known[fact.values.fact_id].fact for fact in same.facts[:2]
    ] == [True, True]
    retyped = [dict(entry.raw) for entry in known.values()]
    retyped[0]["confidence"] = 1.0
    parsed = parse_document({"facts": retyped}, known)
    assert parsed.facts is not None
    assert parsed.facts[0] is not known["a"].fact  # encoded again: 1.0 is stored as a float, 1 as an int
    assert encode_fact(retyped[0], "a").extra != known["a"].fact.values.extra
    assert parsed.facts[1] is known["b"].fact
