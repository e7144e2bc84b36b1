"""Applying an update: sections, removals, new facts, trim, upload scrubbing, malformed documents."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstore.config import MemoryConfig
from memstore.document import MemoryDocument, create_empty_memory, format_timestamp
from memstore.errors import MalformedMemoryError
from memstore.retention import FactSignals
from memstore.update.apply import AppliedUpdate, apply_updates, evict_to_cap
from memstore.update.parser import MemoryUpdate, NewFact, SectionUpdate
from memstore.update.uploads import strip_upload_mentions

CONFIG = MemoryConfig()


def update(
    *,
    new_facts: list[NewFact] | None = None,
    remove: list[str] | None = None,
    user: dict[str, SectionUpdate] | None = None,
    history: dict[str, SectionUpdate] | None = None,
) -> MemoryUpdate:
    return {
        "user": user or {},
        "history": history or {},
        "newFacts": new_facts or [],
        "factsToRemove": remove or [],
        "staleFactsToRemove": [],
        "factsToConsolidate": [],
    }


def fact(content: str, confidence: float = 0.9, category: str = "context") -> NewFact:
    return {"content": content, "category": category, "confidence": confidence}


def stored(fact_id: Any, content: Any, confidence: Any = 0.9, **extra: Any) -> dict[str, Any]:
    return {"id": fact_id, "content": content, "category": "context", "confidence": confidence, **extra}


def memory_with(*facts: dict[str, Any]) -> MemoryDocument:
    memory = create_empty_memory()
    memory["facts"] = list(facts)
    return memory


def contents(memory: MemoryDocument) -> list[str]:
    return [f["content"] for f in memory["facts"]]


def test_removal_applies_and_existing_duplicate_is_skipped() -> None:
    memory = memory_with(stored("fact_py", "User likes Python"), stored("fact_js", "User likes JavaScript"))
    result = apply_updates(
        memory,
        update(remove=["fact_js"], new_facts=[fact("User likes Python")]),
        thread_id="t1",
        config=CONFIG,
    ).memory
    assert contents(result) == ["User likes Python"]


def test_new_fact_may_replace_a_just_removed_one() -> None:
    memory = memory_with(stored("fact_old", "User uses Vim"))
    result = apply_updates(
        memory, update(remove=["fact_old"], new_facts=[fact("user uses vim")]), thread_id="t1", config=CONFIG
    ).memory
    assert contents(result) == ["user uses vim"]
    assert result["facts"][0]["id"] != "fact_old"


def test_whitespace_only_content_is_skipped() -> None:
    result = apply_updates(
        create_empty_memory(), update(new_facts=[fact("   ")]), thread_id="t", config=CONFIG
    ).memory
    assert result["facts"] == []


def test_same_batch_duplicates_keep_the_first_and_source_metadata() -> None:
    result = apply_updates(
        create_empty_memory(),
        update(new_facts=[fact("  User prefers uv  "), fact("USER PREFERS UV", 0.99), fact("User likes Go")]),
        thread_id="thread-9",
        config=CONFIG,
    ).memory
    assert contents(result) == ["User prefers uv", "User likes Go"]
    for new in result["facts"]:
        assert re.fullmatch(r"fact_[0-9a-f]{8}", new["id"])
        assert new["source"] == "thread-9"
        assert new["createdAt"].endswith("Z")
    assert result["facts"][0]["confidence"] == 0.9


def test_case_only_duplicate_of_existing_fact_is_not_stored() -> None:
    memory = memory_with(stored("fact_a", "User likes Python"))
    result = apply_updates(
        memory, update(new_facts=[fact("user LIKES python")]), thread_id=None, config=CONFIG
    ).memory
    assert contents(result) == ["User likes Python"]


def test_missing_thread_id_records_unknown_source() -> None:
    result = apply_updates(
        create_empty_memory(), update(new_facts=[fact("x")]), thread_id=None, config=CONFIG
    ).memory
    assert result["facts"][0]["source"] == "unknown"


def test_threshold_and_max_facts_trim_keep_highest_confidence() -> None:
    config = MemoryConfig(max_facts=10, eviction_policy="confidence")
    memory = memory_with(*(stored(f"fact_{i}", f"old {i}", 0.75) for i in range(9)))
    result = apply_updates(
        memory,
        update(new_facts=[fact("Python", 0.95), fact("too unsure", 0.69), fact("uv", 0.85)]),
        thread_id="t",
        config=config,
    ).memory
    assert len(result["facts"]) == 10
    assert contents(result)[:2] == ["Python", "uv"]
    assert "too unsure" not in contents(result)
    assert "old 8" not in contents(result)  # ties keep prior order, so the last 0.75 fact falls off


def test_threshold_is_inclusive() -> None:
    result = apply_updates(
        create_empty_memory(), update(new_facts=[fact("edge", 0.7)]), thread_id="t", config=CONFIG
    ).memory
    assert contents(result) == ["edge"]


def test_confidence_is_clamped_into_range() -> None:
    result = apply_updates(
        create_empty_memory(),
        update(new_facts=[fact("too sure", 1.5), fact("negative", -0.2)]),
        thread_id="t",
        config=CONFIG,
    ).memory
    assert [(f["content"], f["confidence"]) for f in result["facts"]] == [("too sure", 1.0)]


def test_source_error_kept_only_when_non_blank() -> None:
    with_error: NewFact = {**fact("Use uv", 0.95, "correction"), "sourceError": "Used pip"}
    blank: NewFact = {**fact("Use ruff", 0.95, "correction"), "sourceError": "  "}
    result = apply_updates(
        create_empty_memory(), update(new_facts=[with_error, blank]), thread_id="t", config=CONFIG
    ).memory
    assert result["facts"][0]["sourceError"] == "Used pip"
    assert result["facts"][0]["category"] == "correction"
    assert "sourceError" not in result["facts"][1]


def test_sections_need_should_update_and_a_summary() -> None:
    memory = create_empty_memory()
    memory["user"]["topOfMind"] = {"summary": "old focus", "updatedAt": "2020-01-01T00:00:00Z"}
    result = apply_updates(
        memory,
        update(
            user={
                "workContext": {"summary": "Backend engineer at Acme", "shouldUpdate": True},
                "personalContext": {"summary": "ignored", "shouldUpdate": False},
                "topOfMind": {"summary": "", "shouldUpdate": True},
            },
            history={"recentMonths": {"summary": "Moved to Postgres", "shouldUpdate": True}},
        ),
        thread_id="t",
        config=CONFIG,
    ).memory
    assert result["user"]["workContext"]["summary"] == "Backend engineer at Acme"
    assert result["user"]["workContext"]["updatedAt"].endswith("Z")
    assert result["user"]["personalContext"] == {"summary": "", "updatedAt": ""}
    assert result["user"]["topOfMind"] == {"summary": "old focus", "updatedAt": "2020-01-01T00:00:00Z"}
    assert result["history"]["recentMonths"]["summary"] == "Moved to Postgres"


def test_input_is_not_mutated_and_unknown_keys_survive() -> None:
    memory = memory_with(stored("fact_a", "User likes Python", extraKey={"kept": True}))
    memory["revision"] = 7
    before = copy.deepcopy(memory)
    result = apply_updates(
        memory, update(new_facts=[fact("User likes Go")]), thread_id="t", config=CONFIG
    ).memory
    assert memory == before
    assert result["revision"] == 7
    assert result["facts"][0]["extraKey"] == {"kept": True}


def test_missing_containers_are_created() -> None:
    result = apply_updates(
        {"version": "1.0"}, update(new_facts=[fact("x")]), thread_id="t", config=CONFIG
    ).memory
    assert contents(result) == ["x"]


@pytest.mark.parametrize(
    "memory",
    [
        {"user": "oops", "history": {}, "facts": []},
        {"user": {}, "history": [], "facts": []},
        {"user": {}, "history": {}, "facts": "nope"},
        {"user": {}, "history": {}, "facts": ["not a dict"]},
    ],
)
def test_malformed_documents_raise_a_clear_error(memory: MemoryDocument) -> None:
    with pytest.raises(MalformedMemoryError, match="memory document"):
        apply_updates(memory, update(new_facts=[fact("x")]), thread_id="t", config=CONFIG)


def test_garbage_stored_values_do_not_crash() -> None:
    memory = memory_with(
        stored("fact_a", 123, None),
        {"content": "no id", "confidence": "0.95"},
        stored(["unhashable"], "odd", True),
    )
    memory["user"]["workContext"] = "not a section"
    memory["user"]["topOfMind"] = {"summary": None}
    result = apply_updates(
        memory, update(remove=["fact_a"], new_facts=[fact("new")]), thread_id="t", config=CONFIG
    ).memory
    assert contents(result) == ["no id", "odd", "new"]


class TestEvictToCapByConfidence:
    """``eviction_policy: confidence`` is the reference's trim."""

    CONFIG = MemoryConfig(max_facts=10, eviction_policy="confidence")

    def test_under_the_cap_keeps_order(self) -> None:
        facts = [stored(f"f{i}", f"c{i}", 0.1 * i) for i in range(10)]
        assert evict_to_cap(facts, self.CONFIG) == (facts, {})

    def test_over_the_cap_sorts_by_coerced_confidence(self) -> None:
        fillers = [stored(f"fill{i}", f"f{i}", 0.6) for i in range(6)]
        facts = [
            stored("null", "n", None),
            stored("str", "s", "0.95"),
            stored("low", "l", 0.1),
            stored("nan", "x", float("nan")),
            *fillers,
            stored("big", "b", 7),
        ]
        kept, removals = evict_to_cap(facts, self.CONFIG)
        assert [f["id"] for f in kept] == ["big", "str", *(f["id"] for f in fillers), "null", "nan"]
        assert list(removals) == ["low"]
        assert removals["low"]["reason"] == "evicted" and removals["low"]["max_facts"] == 10


class TestStripUploadMentions:
    @staticmethod
    def scrub_summary(summary: str) -> str:
        memory = create_empty_memory()
        memory["user"]["topOfMind"]["summary"] = summary
        return str(strip_upload_mentions(memory)["user"]["topOfMind"]["summary"])

    def test_upload_event_sentence_removed(self) -> None:
        assert (
            self.scrub_summary(
                "User is interested in AI. User uploaded a test file for verification. User prefers Python."
            )
            == "User is interested in AI.User prefers Python."
        )

    def test_upload_path_sentence_removed_with_reference_quirk(self) -> None:
        assert (
            self.scrub_summary(
                "User uses Python. User uploaded file to /mnt/user-data/uploads/tid/data.csv. Done."
            )
            == "User uses Python.csv. Done."
        )

    def test_legitimate_mentions_are_preserved(self) -> None:
        text = "User regularly works with CSV files. User prefers PDF export."
        assert self.scrub_summary(text) == text

    def test_uploading_a_test_file_removed(self) -> None:
        assert self.scrub_summary("Uploading a test file now. Works at Acme.") == "Works at Acme."

    def test_upload_facts_removed_and_others_kept(self) -> None:
        memory = memory_with(
            stored("a", "User uploaded a spreadsheet file"),
            stored("b", "User wants a file upload feature"),
            stored("c", "User works with CSV files"),
        )
        assert [f["id"] for f in strip_upload_mentions(memory)["facts"]] == ["c"]

    def test_empty_memory_unchanged(self) -> None:
        memory = create_empty_memory()
        assert strip_upload_mentions(copy.deepcopy(memory)) == memory

    def test_apply_scrubs_pre_existing_summaries_and_facts(self) -> None:
        memory = memory_with(stored("a", "User uploaded three files"))
        memory["history"]["recentMonths"]["summary"] = "User uploaded some documents. Works on memstore."
        result = apply_updates(memory, update(), thread_id="t", config=CONFIG).memory
        assert result["facts"] == []
        assert result["history"]["recentMonths"]["summary"] == "Works on memstore."


# The reference's sentence pattern; strip_upload_mentions must scrub exactly what it matches.
REFERENCE_UPLOAD_SENTENCE = re.compile(
    r"[^.!?]*\b(?:upload(?:ed|ing)?(?:\s+\w+){0,3}\s+(?:file|files?|document|documents?|attachment|attachments?)"
    r"|file\s+upload|/mnt/user-data/uploads/|<uploaded_files>)[^.!?]*[.!?]?\s*",
    re.IGNORECASE,
)
upload_prose = st.lists(
    st.sampled_from(
        ["upload", "uploaded", "Uploading", "file", "files", "documents", "attachment", "file upload",
         "/mnt/user-data/uploads/", "<uploaded_files>", "x", "a b", " ", "  ", "\n", ".", "!", "?",
         "x.y", "_"]
    )
    | st.text(max_size=3),
    max_size=14,
).map("".join)  # fmt: skip


@settings(max_examples=500, deadline=None, derandomize=True)
@given(upload_prose)
def test_upload_scrubbing_matches_the_reference_pattern(text: str) -> None:
    memory = create_empty_memory()
    memory["user"]["topOfMind"]["summary"] = text
    memory["facts"] = [stored("a", text)]
    scrubbed = strip_upload_mentions(memory)
    assert scrubbed["user"]["topOfMind"]["summary"] == re.sub(
        r"  +", " ", REFERENCE_UPLOAD_SENTENCE.sub("", text).strip()
    )
    assert bool(scrubbed["facts"]) == (REFERENCE_UPLOAD_SENTENCE.search(text) is None)


class TestConfirmedRestatements:
    def test_a_restated_fact_is_confirmed_and_not_duplicated(self) -> None:
        memory = memory_with(stored("fact_py", "User likes Python"), stored("fact_go", "User likes Go"))
        result = apply_updates(
            memory,
            update(
                new_facts=[
                    fact("  user likes PYTHON "),
                    fact("User likes Python", 0.95),
                    fact("User likes Rust"),
                ]
            ),
            thread_id="t",
            config=CONFIG,
        )
        assert contents(result.memory) == ["User likes Python", "User likes Go", "User likes Rust"]
        assert result.confirmed == ["fact_py"]

    def test_a_restatement_below_the_threshold_confirms_nothing(self) -> None:
        memory = memory_with(stored("fact_py", "User likes Python"))
        result = apply_updates(
            memory, update(new_facts=[fact("User likes Python", 0.5)]), thread_id="t", config=CONFIG
        )
        assert result.confirmed == [] and contents(result.memory) == ["User likes Python"]

    def test_a_replaced_fact_is_not_confirmed(self) -> None:
        memory = memory_with(stored("fact_old", "User uses Vim"))
        result = apply_updates(
            memory,
            update(remove=["fact_old"], new_facts=[fact("User uses Vim")]),
            thread_id="t",
            config=CONFIG,
        )
        assert result.confirmed == [] and result.memory["facts"][0]["id"] != "fact_old"

    def test_an_id_less_restated_fact_is_not_reported(self) -> None:
        memory = memory_with({"content": "User likes tea", "confidence": 0.9})
        result = apply_updates(
            memory, update(new_facts=[fact("User likes tea")]), thread_id="t", config=CONFIG
        )
        assert result.confirmed == [] and len(result.memory["facts"]) == 1


class TestEvictionPolicyAtTheCap:
    """Document-level cap: ``confidence`` is the reference's trim, ``hybrid`` also weighs freshness."""

    NOW = datetime(2026, 7, 1, tzinfo=UTC)

    def fresh(
        self, fact_id: str, confidence: float, category: str = "context", days: int = 0
    ) -> dict[str, Any]:
        created = format_timestamp(self.NOW - timedelta(days=days))
        return {**stored(fact_id, f"content {fact_id}", confidence, createdAt=created), "category": category}

    def memory(self) -> MemoryDocument:
        return memory_with(
            *(self.fresh(f"fill{i}", 0.95) for i in range(9)), self.fresh("old", 0.80, days=365)
        )

    def apply(self, memory: MemoryDocument, new: list[NewFact], policy: str) -> AppliedUpdate:
        config = MemoryConfig(max_facts=10, eviction_policy=policy)  # type: ignore[arg-type]
        return apply_updates(memory, update(new_facts=new), thread_id="t", config=config, now=self.NOW)

    def test_confidence_policy_drops_the_least_confident(self) -> None:
        result = self.apply(self.memory(), [fact("new fact", 0.78)], "confidence")
        assert "new fact" not in contents(result.memory) and "content old" in contents(result.memory)
        assert result.removals == {}  # the dropped fact was never stored, so it needs no audit

    def test_hybrid_evicts_an_old_never_confirmed_fact_before_a_new_slightly_less_confident_one(self) -> None:
        result = self.apply(self.memory(), [fact("new fact", 0.78)], "hybrid")
        assert "content old" not in contents(result.memory)
        assert contents(result.memory)[-1] == "new fact"  # hybrid keeps document order
        assert result.removals["old"]["reason"] == "evicted" and result.removals["old"]["max_facts"] == 10
        assert result.removals["old"]["freshness"] == round(0.5 * 2 ** (-365 / 90), 6)

    def test_a_restated_fact_counts_as_freshly_confirmed(self) -> None:
        result = self.apply(self.memory(), [fact("content old", 0.9), fact("new fact", 0.78)], "hybrid")
        assert "content old" in contents(result.memory) and "new fact" not in contents(result.memory)
        assert result.confirmed == ["old"]

    def test_corrections_keep_their_reserved_slot_under_hybrid_only(self) -> None:
        memory = memory_with(
            self.fresh("fix", 0.3, "correction"), *(self.fresh(f"f{i}", 0.9) for i in range(10))
        )
        hybrid = self.apply(memory, [], "hybrid")
        assert [f["id"] for f in hybrid.memory["facts"]] == ["fix", *(f"f{i}" for i in range(9))]
        assert list(hybrid.removals) == ["f9"]
        confidence = self.apply(memory, [], "confidence")
        assert "fix" not in [f["id"] for f in confidence.memory["facts"]] and list(confidence.removals) == [
            "fix"
        ]

    def test_store_signals_rank_hybrid_eviction(self) -> None:
        memory = memory_with(*(self.fresh(f"f{i}", 0.8, days=200) for i in range(11)))
        heat = FactSignals(last_accessed_at=self.NOW, access_count=8)
        config = MemoryConfig(max_facts=10)
        result = apply_updates(
            memory, update(), thread_id="t", config=config, signals={"f10": heat}, now=self.NOW
        )
        assert list(result.removals) == ["f9"] and result.removals["f9"]["heat"] == 0.0
