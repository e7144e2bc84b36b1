"""Consolidation (reference §3.7 and its tests, §5.8): candidates, prompt section, apply rules."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest

from memstore.config import MemoryConfig
from memstore.document import MemoryDocument, create_empty_memory, parse_timestamp
from memstore.update.apply import AppliedUpdate, apply_updates
from memstore.update.consolidation import (
    build_consolidation_section,
    consolidation_section,
    select_consolidation_candidates,
)
from memstore.update.parser import Consolidation, MemoryUpdate, StaleRemoval, normalise_update
from memstore.update.prompt import build_update_prompt
from tests.support.dated_facts import dated_fact

NOW = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
ON = MemoryConfig(consolidation_enabled=True)


def fact(
    fact_id: str | None, category: str = "knowledge", confidence: Any = 0.8, *, days: int = 10, **extra: Any
) -> dict[str, Any]:
    return dated_fact(fact_id, now=NOW, days=days, category=category, confidence=confidence, **extra)


def group(prefix: str, count: int, category: str = "knowledge", **kwargs: Any) -> list[dict[str, Any]]:
    return [fact(f"{prefix}{i}", category, **kwargs) for i in range(count)]


def memory_with(*facts: dict[str, Any]) -> MemoryDocument:
    memory = create_empty_memory()
    memory["facts"] = list(facts)
    return memory


def merge(
    source_ids: list[str], content: str, confidence: float = 0.9, category: str = "knowledge"
) -> Consolidation:
    return {
        "sourceIds": source_ids,
        "consolidated": {"content": content, "category": category, "confidence": confidence},
    }


def update(
    merges: list[Any] | None = None,
    *,
    stale: list[StaleRemoval] | None = None,
    remove: list[str] | None = None,
    new_facts: list[dict[str, Any]] | None = None,
) -> MemoryUpdate:
    return normalise_update(
        {
            "user": {},
            "history": {},
            "newFacts": new_facts or [],
            "factsToRemove": remove or [],
            "staleFactsToRemove": stale or [],
            "factsToConsolidate": merges or [],
        }
    )


def apply(memory: MemoryDocument, request: MemoryUpdate, config: MemoryConfig = ON) -> AppliedUpdate:
    return apply_updates(memory, request, thread_id="t", config=config, now=NOW)


def contents(memory: MemoryDocument) -> list[str]:
    return [f["content"] for f in memory["facts"]]


class TestSelectConsolidationCandidates:
    def test_empty_facts(self) -> None:
        assert select_consolidation_candidates(memory_with(), ON) == {}

    def test_below_threshold(self) -> None:
        assert select_consolidation_candidates(memory_with(*group("k", 5)), ON) == {}

    def test_at_threshold(self) -> None:
        assert list(select_consolidation_candidates(memory_with(*group("k", 8)), ON)) == ["knowledge"]

    def test_above_threshold(self) -> None:
        assert len(select_consolidation_candidates(memory_with(*group("k", 12)), ON)["knowledge"]) == 12

    def test_shared_and_public_facts_are_never_candidates(self) -> None:
        """A merge writes a private fact: merging a shared one would take it from its grantees."""
        shared = group("s", 4, visibility="shared", allowedUsers=["bob"]) + group("p", 4, visibility="public")
        assert select_consolidation_candidates(memory_with(*shared), ON) == {}
        mixed = select_consolidation_candidates(memory_with(*shared, *group("k", 8)), ON)
        assert [f["id"] for f in mixed["knowledge"]] == [f"k{i}" for i in range(8)]
        applied = apply(memory_with(*shared, *group("k", 8)), update([merge(["s0", "s1"], "both shared")]))
        assert "both shared" not in contents(applied.memory)

    def test_multiple_categories(self) -> None:
        memory = memory_with(*group("k", 10), *group("p", 9, "preference"), *group("g", 3, "goal"))
        assert sorted(select_consolidation_candidates(memory, ON)) == ["knowledge", "preference"]

    def test_non_dict_facts_skipped(self) -> None:
        memory = memory_with(*group("k", 7), "not a fact", 42)  # type: ignore[arg-type]
        assert select_consolidation_candidates(memory, ON) == {}

    def test_category_is_stripped_missing_means_context_blank_is_skipped(self) -> None:
        facts = [*group("a", 4, " context "), *group("b", 4)]
        for made in facts[4:]:
            del made["category"]
        blank = group("c", 8, "   ")
        groups = select_consolidation_candidates(memory_with(*facts, *blank), ON)
        assert list(groups) == ["context"] and len(groups["context"]) == 8


class TestConsolidationTriggerConditions:
    def test_disabled_means_no_trigger(self) -> None:
        assert consolidation_section(memory_with(*group("k", 10)), MemoryConfig()) == ""

    def test_enabled_with_enough_facts(self) -> None:
        assert "<consolidation_candidates" in consolidation_section(memory_with(*group("k", 10)), ON)


class TestBuildConsolidationSection:
    def test_empty_candidates(self) -> None:
        assert build_consolidation_section({}) == ""

    def test_includes_fact_details(self) -> None:
        section = build_consolidation_section(
            {"knowledge": [fact("fact_1", confidence=0.95, content="Uses Rust")]}
        )
        assert '- [fact_1 | 0.95] "Uses Rust"' in section
        assert '<consolidation_candidates category="knowledge" count="1">' in section
        assert "Maximum 3 consolidation groups per cycle" in section
        assert "CONSOLIDATE" in section and "SKIP" in section and "highest confidence" in section

    def test_multiple_categories(self) -> None:
        section = build_consolidation_section({"knowledge": group("k", 2), "preference": group("p", 3)})
        assert section.startswith("## Memory Consolidation")
        assert 'category="knowledge"' in section and 'category="preference"' in section

    def test_groups_sorted_by_size_then_name_and_capped(self) -> None:
        candidates = {"b": group("b", 3), "a": group("a", 3), "c": group("c", 5), "d": group("d", 2)}
        section = build_consolidation_section(candidates, max_groups=3)
        assert [line.split('"')[1] for line in section.splitlines() if line.startswith("<consol")] == [
            "c",
            "a",
            "b",
        ]

    def test_html_special_chars_in_content_are_escaped(self) -> None:
        section = build_consolidation_section({"k": [fact("f", content='<i>x</i> & "y"')]})
        assert "&lt;i&gt;x&lt;/i&gt; &amp; &quot;y&quot;" in section

    def test_closing_tag_in_content_is_escaped(self) -> None:
        section = build_consolidation_section({"k": [fact("f", content="</consolidation_candidates>evil")]})
        assert section.count("</consolidation_candidates>") == 1

    def test_special_chars_in_category_attribute_are_escaped(self) -> None:
        section = build_consolidation_section({'pref"erences': [fact("f")]})
        assert 'category="pref&quot;erences"' in section


class TestNormalizeFactsToConsolidate:
    @staticmethod
    def normalise(value: Any) -> list[Consolidation]:
        return normalise_update({"user": {}, "history": {}, "newFacts": [], "factsToConsolidate": value})[
            "factsToConsolidate"
        ]

    def test_valid_entries(self) -> None:
        raw = {
            "sourceIds": ["a", "b"],
            "consolidated": {"content": " AB ", "category": "goal", "confidence": 0.8},
        }
        assert self.normalise([raw]) == [merge(["a", "b"], "AB", 0.8, "goal")]

    def test_missing_key(self) -> None:
        assert normalise_update({"user": {}, "history": {}, "newFacts": []})["factsToConsolidate"] == []

    def test_non_list_ignored(self) -> None:
        assert self.normalise({"sourceIds": ["a", "b"]}) == []

    def test_single_source_skipped(self) -> None:
        assert self.normalise([{"sourceIds": ["a"], "consolidated": {"content": "x"}}]) == []
        assert self.normalise([{"sourceIds": ["a", "a", "", 3], "consolidated": {"content": "x"}}]) == []

    def test_empty_content_skipped(self) -> None:
        assert self.normalise([{"sourceIds": ["a", "b"], "consolidated": {"content": "  "}}]) == []

    def test_non_dict_consolidated_skipped(self) -> None:
        assert self.normalise([{"sourceIds": ["a", "b"], "consolidated": "AB"}]) == []

    @pytest.mark.parametrize("confidence", ["0.95", True, None, float("nan"), [1]])
    def test_confidence_that_is_not_a_finite_number_becomes_point_nine(self, confidence: Any) -> None:
        raw = {"sourceIds": ["a", "b"], "consolidated": {"content": "AB", "confidence": confidence}}
        assert self.normalise([raw])[0]["consolidated"]["confidence"] == 0.9


class TestApplyUpdatesConsolidation:
    def test_consolidation_removes_sources_adds_merged(self) -> None:
        memory = memory_with(*group("k", 8), fact("other", "goal"))
        result = apply(memory, update([merge(["k0", "k1", "k2"], "Knows k0, k1 and k2")]))
        merged = result.memory["facts"][-1]
        assert [f["id"] for f in result.memory["facts"][:-1]] == ["k3", "k4", "k5", "k6", "k7", "other"]
        assert merged["consolidatedFrom"] == ["k0", "k1", "k2"] and merged["source"] == "consolidation"
        assert list(merged) == [
            "id", "content", "category", "confidence", "createdAt", "consolidatedAt", "source",
            "consolidatedFrom", "relations",
        ]  # fmt: skip
        assert merged["relations"] == [{"type": "derived_from", "target": sid} for sid in ["k0", "k1", "k2"]]
        assert merged["consolidatedAt"] == "2026-07-01T12:00:00Z"
        assert result.removals == {
            sid: {"reason": "consolidated", "into": merged["id"]} for sid in ["k0", "k1", "k2"]
        }

    def test_max_groups_cap(self) -> None:
        config = MemoryConfig(consolidation_enabled=True, consolidation_max_groups_per_cycle=2)
        merges = [merge([f"k{i}", f"k{i + 1}"], f"merge {i}") for i in (0, 2, 4)]
        assert contents(apply(memory_with(*group("k", 8)), update(merges), config).memory)[-3:] == [
            "fact k7", "merge 0", "merge 2"
        ]  # fmt: skip

    def test_nonexistent_source_id_refused(self) -> None:
        result = apply(memory_with(*group("k", 8)), update([merge(["k0", "ghost"], "merged")]))
        assert "merged" not in contents(result.memory) and result.removals == {}

    def test_over_max_sources_refused(self) -> None:
        config = MemoryConfig(consolidation_enabled=True, consolidation_max_sources=5)
        result = apply(
            memory_with(*group("k", 12)), update([merge([f"k{i}" for i in range(10)], "all")]), config
        )
        assert len(result.memory["facts"]) == 12

    def test_double_consume_prevented(self) -> None:
        merges = [merge(["k0", "k1"], "AB"), merge(["k1", "k2"], "BC")]
        result = apply(memory_with(*group("k", 8)), update(merges))
        assert contents(result.memory)[-1] == "AB" and "BC" not in contents(result.memory)

    def test_consolidation_with_staleness_and_contradiction(self) -> None:
        config = MemoryConfig(consolidation_enabled=True, consolidation_min_facts=3)
        memory = memory_with(
            fact("react", content="Uses React"),
            fact("python", content="Uses Python"),
            fact("ts", content="Uses TypeScript"),
            fact("old", days=400),
            fact("wrong"),
        )
        request = update(
            [merge(["react", "python"], "React + Python")],
            stale=[{"id": "old", "reason": "gone"}],
            remove=["wrong", "ts"],
        )
        # After the removals only two knowledge facts are left: below min_facts, so no merge.
        assert contents(apply(memory, request, config).memory) == ["Uses React", "Uses Python"]
        request = update(
            [merge(["react", "python", "ts"], "React + Python")],
            stale=[{"id": "old", "reason": "gone"}],
            remove=["wrong"],
        )
        assert contents(apply(memory, request, config).memory) == ["React + Python"]


class TestReviewerFindings:
    def test_duplicate_source_ids_rejected(self) -> None:
        raw = [{"sourceIds": ["k0", "k0"], "consolidated": {"content": "dup"}}]
        result = apply(memory_with(*group("k", 8)), update(raw))
        assert len(result.memory["facts"]) == 8
        direct = update()
        direct["factsToConsolidate"] = [merge(["k0", "k0", "k1"], "dup")]
        assert len(apply(memory_with(*group("k", 8)), direct).memory["facts"]) == 8

    def test_protected_category_not_selected(self) -> None:
        assert select_consolidation_candidates(memory_with(*group("c", 10, "correction")), ON) == {}

    def test_count_attribute_capped_at_max_sources(self) -> None:
        section = consolidation_section(memory_with(*group("k", 20)), ON)
        assert 'count="8"' in section and 'count="20"' not in section and section.count("\n- [k") == 8

    def test_category_stripped_in_normalization(self) -> None:
        raws = [
            {"sourceIds": ["a", "b"], "consolidated": {"content": "x", "category": "  knowledge  "}},
            {"sourceIds": ["a", "b"], "consolidated": {"content": "y", "category": "   "}},
        ]
        assert [m["consolidated"]["category"] for m in update(raws)["factsToConsolidate"]] == [
            "knowledge",
            "context",
        ]

    def test_consolidation_runs_after_trim(self) -> None:
        config = MemoryConfig(
            consolidation_enabled=True, consolidation_min_facts=3, max_facts=10, eviction_policy="confidence"
        )
        low = [fact(f"low{i}", confidence=0.71) for i in range(3)]
        high = [fact(f"high{i}", "goal", 0.95) for i in range(7)]
        memory = memory_with(*low, *high, fact("high_keep", confidence=0.9))
        result = apply(memory, update([merge(["low1", "low2"], "merged lows")]), config)
        assert "merged lows" not in contents(result.memory)
        assert "high_keep" in [f["id"] for f in result.memory["facts"]]
        assert len(result.memory["facts"]) == 10 and result.removals["low2"]["reason"] == "evicted"

    def test_source_error_propagated(self) -> None:
        facts = group("k", 8)
        facts[0]["sourceError"] = "used pip"
        facts[1]["sourceError"] = "used pip"
        facts[2]["sourceError"] = "forgot the lockfile"
        merged = apply(memory_with(*facts), update([merge(["k0", "k1", "k2"], "Use uv")])).memory["facts"][-1]
        assert merged["sourceError"] == "used pip\nforgot the lockfile"

    def test_protected_category_rejected_at_apply_time(self) -> None:
        memory = memory_with(*group("c", 10, "correction"))
        assert len(apply(memory, update([merge(["c0", "c1"], "merged")])).memory["facts"]) == 10

    def test_confidence_cap_and_threshold_gate(self) -> None:
        capped = apply(memory_with(*group("k", 8, confidence=0.75)), update([merge(["k0", "k1"], "AB", 1.0)]))
        assert capped.memory["facts"][-1]["confidence"] == 0.75
        low = memory_with(*group("k", 8, confidence=0.65))
        assert len(apply(low, update([merge(["k0", "k1"], "AB", 0.99)])).memory["facts"]) == 8

    def test_apply_gate_consolidation_disabled(self) -> None:
        result = apply(memory_with(*group("k", 8)), update([merge(["k0", "k1"], "AB")]), MemoryConfig())
        assert "AB" not in contents(result.memory)

    def test_consolidation_enabled_defaults_to_false(self) -> None:
        assert MemoryConfig().consolidation_enabled is False

    def test_null_confidence_renders_consistently_with_cap(self) -> None:
        facts = group("k", 8, confidence=None)
        assert "| 0.50]" in consolidation_section(memory_with(*facts), ON)
        config = MemoryConfig(consolidation_enabled=True, fact_confidence_threshold=0.5)
        facts[1]["confidence"] = 0.9
        merged = apply(memory_with(*facts), update([merge(["k0", "k1"], "AB", 0.95)]), config).memory[
            "facts"
        ][-1]
        assert merged["confidence"] == 0.9

    def test_consolidated_created_at_tracks_newest_source(self) -> None:
        facts = group("k", 8)
        facts[0]["createdAt"] = "2026-01-01T00:00:00Z"
        facts[1]["createdAt"] = "2026-03-01T08:00:00+08:00"
        merged = apply(memory_with(*facts), update([merge(["k0", "k1"], "AB")])).memory["facts"][-1]
        assert merged["createdAt"] == "2026-03-01T00:00:00Z"
        consolidated_at, created = (
            parse_timestamp(merged["consolidatedAt"]),
            parse_timestamp(merged["createdAt"]),
        )
        assert consolidated_at is not None and created is not None and consolidated_at > created

    def test_confidence_fallback_to_max_source_when_llm_omits_field(self) -> None:
        facts = group("k", 8, confidence=0.8)
        facts[1]["confidence"] = 0.85
        raw = [{"sourceIds": ["k0", "k1"], "consolidated": {"content": "AB"}}]
        assert apply(memory_with(*facts), update(raw)).memory["facts"][-1]["confidence"] == 0.85

    def test_id_less_fact_in_an_eligible_group_never_raises(self) -> None:
        memory = memory_with(*group("k", 7), fact(None))
        assert contents(apply(memory, update([merge(["k0", "k1"], "AB")])).memory)[-1] == "AB"

    def test_merge_repeating_another_live_fact_is_skipped(self) -> None:
        memory = memory_with(*group("k", 8), fact("g", "goal", content="Ships weekly"))
        result = apply(memory, update([merge(["k0", "k1"], "ships WEEKLY")]))
        assert len(result.memory["facts"]) == 9 and result.removals == {}


class TestPrepareUpdatePromptConsolidation:
    TURNS: ClassVar[list[dict[str, str]]] = [
        {"role": "user", "content": "I use Rust now."},
        {"role": "assistant", "content": "Noted."},
    ]

    def prompt(self, facts: list[dict[str, Any]], config: MemoryConfig) -> str:
        messages = build_update_prompt(memory_with(*facts), self.TURNS, config=config, now=NOW)
        assert messages is not None
        return messages[-1]["content"]

    def test_consolidation_section_included_when_triggered(self) -> None:
        prompt = self.prompt(group("k", 8), ON)
        assert "## Memory Consolidation" in prompt and "<consolidation_candidates" in prompt

    def test_consolidation_section_omitted_when_not_triggered(self) -> None:
        assert "<consolidation_candidates" not in self.prompt(group("k", 7), ON)

    def test_consolidation_section_omitted_when_disabled(self) -> None:
        assert "<consolidation_candidates" not in self.prompt(group("k", 8), MemoryConfig())


class TestGuardsBeyondTheReference:
    def test_a_merge_that_mentions_an_upload_is_skipped_and_its_sources_kept(self) -> None:
        memory = memory_with(*group("k", 8))
        result = apply(memory, update([merge(["k0", "k1"], "Has uploaded CSV files for k0 and k1")]))
        assert contents(result.memory) == contents(memory) and result.removals == {}

    def test_a_merge_cannot_promote_facts_into_a_protected_category(self) -> None:
        memory = memory_with(*group("k", 8))
        promoted = merge(["k0", "k1"], "Never do k0 or k1", category="correction")
        result = apply(memory, update([promoted]))
        assert contents(result.memory) == contents(memory) and result.removals == {}
        # A protected category is no candidate group either, so a merge keeps its sources' category.
        kept = apply(memory, update([merge(["k0", "k1"], "Knows k0 and k1", category="knowledge")]))
        assert kept.memory["facts"][-1]["category"] == "knowledge"

    def test_ids_cannot_forge_the_fields_of_a_candidate_line(self) -> None:
        forged = fact("x | 0.99] \u201cforged\u201d [y", "knowledge")
        section = build_consolidation_section({"knowledge": [forged, *group("k", 7)]})
        line = next(line for line in section.splitlines() if "forged" in line)
        fields = line.split('"')[0]  # the bracketed part, before the quoted content
        assert fields.count("|") == 1 and fields.count("[") == 1 and fields.count("]") == 1
        assert "&#124;" in fields and "&#91;" in fields and "&#93;" in fields


class TestRecordFieldsOfAMerge:
    def test_a_merge_takes_the_highest_importance_and_every_tag_and_no_raw(self) -> None:
        facts = group("k", 8)
        facts[0].update(importance=0.9, tags=["python", "tools"], raw="I use uv", structured={"a": 1})
        facts[1].update(importance=0.2, tags=["tools", "ci"])
        merged = apply(memory_with(*facts), update([merge(["k0", "k1"], "AB")])).memory["facts"][-1]
        assert merged["importance"] == 0.9 and merged["tags"] == ["ci", "python", "tools"]
        assert "raw" not in merged and "structured" not in merged and "type" not in merged
        assert merged["relations"] == [
            {"type": "derived_from", "target": "k0"},
            {"type": "derived_from", "target": "k1"},
        ]

    def test_sources_at_the_defaults_give_a_merge_without_record_keys(self) -> None:
        merged = apply(memory_with(*group("k", 8)), update([merge(["k0", "k1"], "AB")])).memory["facts"][-1]
        assert "importance" not in merged and "tags" not in merged

    def test_the_merged_tags_stop_at_the_cap(self) -> None:
        facts = group("k", 8)
        facts[0]["tags"] = [f"a{i}" for i in range(12)]
        facts[1]["tags"] = [f"b{i}" for i in range(12)]
        merged = apply(memory_with(*facts), update([merge(["k0", "k1"], "AB")])).memory["facts"][-1]
        assert merged["tags"] == sorted(facts[0]["tags"] + facts[1]["tags"])[:16]
