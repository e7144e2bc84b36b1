"""Reply parsing: text extraction, tolerant object scanning, normalisation, fail-closed removals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memstore.errors import MemoryUpdateParseError, UnsafeMemoryUpdateError
from memstore.update.parser import extract_text, parse_update_response

EMPTY_UPDATE: dict[str, Any] = {"user": {}, "history": {}, "newFacts": [], "factsToRemove": []}


def reply(**overrides: Any) -> str:
    return json.dumps({**EMPTY_UPDATE, **overrides}, ensure_ascii=False)


GOOD = reply(newFacts=[{"content": "User likes Python", "category": "preference", "confidence": 0.9}])


class TestExtractText:
    @pytest.mark.parametrize(
        ("content", "expected"),
        [
            ("plain", "plain"),
            ([{"type": "text", "text": "one"}], "one"),
            ([{"text": "one"}, {"text": "two"}], "one\ntwo"),
            (["only string"], "only string"),
            (['{"user"', ': "alice"}'], '{"user": "alice"}'),
            (["raw text", {"text": "block text"}], "raw text\nblock text"),
            (["a", "b", {"text": "c"}], "ab\nc"),
            (["a", {"type": "image", "url": "x"}, "b"], "a\nb"),
            ([], ""),
            ([{"type": "image"}], ""),
            (42, "42"),
            (None, ""),
        ],
    )
    def test_flattening(self, content: object, expected: str) -> None:
        assert extract_text(content) == expected


@pytest.mark.parametrize(
    "wrapped",
    [
        f"<think>Let me think about {{this}}.</think>\n{GOOD}",
        f"<think>unclosed reasoning\n{GOOD}",
        f"Here is the update:\n{GOOD}",
        f"{GOOD}\nDone.",
        f"```json\n{GOOD}\n```",
    ],
)
def test_wrapped_json_parses(wrapped: str) -> None:
    assert parse_update_response(wrapped)["newFacts"][0]["content"] == "User likes Python"


def test_list_content_parses() -> None:
    half = len(GOOD) // 2
    assert parse_update_response([GOOD[:half], GOOD[half:]])["newFacts"][0]["confidence"] == 0.9
    assert parse_update_response([{"type": "text", "text": GOOD}])["newFacts"]


def test_unrelated_leading_object_is_skipped() -> None:
    assert parse_update_response('{"user": "alice"} then ' + GOOD)["newFacts"]


def test_decoy_object_alone_is_rejected() -> None:
    with pytest.raises(MemoryUpdateParseError):
        parse_update_response('{"user": "alice"}')


def test_truncated_json_is_rejected_not_repaired() -> None:
    with pytest.raises(MemoryUpdateParseError, match="user, history and newFacts"):
        parse_update_response(GOOD[:-5])


def test_complete_inner_object_inside_truncated_outer_is_accepted() -> None:
    assert parse_update_response('{"wrapper": ' + GOOD)["newFacts"]


def test_facts_to_remove_is_optional() -> None:
    update = parse_update_response('{"user": {}, "history": {}, "newFacts": []}')
    assert update["factsToRemove"] == []


def test_garbage_is_rejected() -> None:
    with pytest.raises(MemoryUpdateParseError):
        parse_update_response("I could not produce an update, sorry.")


def test_sections_are_normalised() -> None:
    update = parse_update_response(
        reply(
            user={
                "workContext": {"summary": "Backend engineer", "shouldUpdate": True},
                "personalContext": {"summary": 42, "shouldUpdate": True},
                "topOfMind": "not a dict",
                "madeUp": {"summary": "x", "shouldUpdate": True},
            },
            history={"recentMonths": {"summary": "Migrating", "shouldUpdate": "true"}},
        )
    )
    assert update["user"] == {
        "workContext": {"summary": "Backend engineer", "shouldUpdate": True},
        "personalContext": {"summary": "", "shouldUpdate": True},
    }
    assert update["history"] == {"recentMonths": {"summary": "Migrating", "shouldUpdate": True}}


def test_schema_guard_ignores_invalid_top_level_fields() -> None:
    update = parse_update_response(
        reply(user="bad", history=["bad"], factsToRemove="fact_1", newFacts=["bad", {"content": "Good fact"}])
    )
    assert update["user"] == {} and update["history"] == {}
    assert update["factsToRemove"] == []
    assert update["newFacts"] == [{"content": "Good fact", "category": "context", "confidence": 0.5}]


def test_fact_fields_are_coerced_and_filtered() -> None:
    update = parse_update_response(
        reply(
            newFacts=[
                {"content": "  Kept  ", "category": 9, "confidence": "0.91", "sourceError": "  bad call  "},
                {"content": "Blank error", "category": " goal ", "confidence": 1, "sourceError": "   "},
                {"content": "Bool confidence", "confidence": True},
                {"content": "Null confidence", "confidence": None},
                {"content": "Text confidence", "confidence": "high"},
                {"content": "Empty confidence", "confidence": "  "},
                {"content": "NaN confidence", "confidence": float("nan")},
                {"content": 123, "confidence": 0.9},
                {"content": "   ", "confidence": 0.9},
            ]
        )
    )
    assert update["newFacts"] == [
        {"content": "Kept", "category": "context", "confidence": 0.91, "sourceError": "bad call"},
        {"content": "Blank error", "category": "goal", "confidence": 1.0},
    ]


def test_out_of_range_confidence_is_left_for_apply_to_clamp() -> None:
    assert (
        parse_update_response(reply(newFacts=[{"content": "x", "confidence": 1.5}]))["newFacts"][0][
            "confidence"
        ]
        == 1.5
    )


def test_removals_with_malformed_new_facts_fail_closed() -> None:
    with pytest.raises(UnsafeMemoryUpdateError, match="factsToRemove"):
        parse_update_response(
            reply(factsToRemove=["fact_1"], newFacts=[{"content": "ok"}, {"content": None}])
        )
    with pytest.raises(UnsafeMemoryUpdateError):
        parse_update_response(reply(factsToRemove=["fact_1"], newFacts="User likes Go"))


def test_removals_with_clean_new_facts_are_accepted() -> None:
    update = parse_update_response(
        reply(factsToRemove=["fact_1", 7], newFacts=[{"content": "User likes Go", "confidence": 0.9}])
    )
    assert update["factsToRemove"] == ["fact_1"]


def test_malformed_new_facts_without_removals_keep_the_good_ones() -> None:
    update = parse_update_response(reply(newFacts=[{"content": "ok", "confidence": 0.8}, "junk"]))
    assert [fact["content"] for fact in update["newFacts"]] == ["ok"]
