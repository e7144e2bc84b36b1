"""The offline rule-based extractor: what it catches, what it refuses, and its JSON contract."""

from __future__ import annotations

import pytest

from memstore.config import MemoryConfig
from memstore.document import create_empty_memory
from memstore.update.apply import apply_updates
from memstore.update.rules import extract_findings, extract_update


def said(*texts: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text} for text in texts]


def facts_of(*texts: str, correction: bool = False) -> list[tuple[str, str]]:
    return [(f.content, f.category) for f in extract_findings(said(*texts), correction_detected=correction)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("My name is Ana Silva.", ("User's name is Ana Silva", "context")),
        ("Call me Ana", ("User wants to be called Ana", "preference")),
        (
            "Hi! I work at Acme Robotics as a backend engineer.",
            ("User works at Acme Robotics as a backend engineer", "context"),
        ),
        ("I work as a DBA.", ("User works as a DBA", "context")),
        ("I'm a data engineer.", ("User is a data engineer", "context")),
        ("I live in Lisbon", ("User lives in Lisbon", "context")),
        ("I prefer concise answers.", ("User prefers concise answers", "preference")),
        ("I'd rather see tables", ("User would rather see tables", "preference")),
        ("I love my dog", ("User loves their dog", "preference")),
        ("I hate YAML!", ("User dislikes YAML", "preference")),
        ("I don't like long answers", ("User dislikes long answers", "preference")),
        ("I want to learn Rust.", ("User wants to learn Rust", "goal")),
        ("I'm trying to cut our AWS bill", ("User is trying to cut their AWS bill", "goal")),
        ("My goal is to ship v2 this quarter.", ("User's goal is to ship v2 this quarter", "goal")),
        ("我叫小王。", ("用户叫小王", "context")),
        ("你好,我在杭州的一家金融科技公司工作。", ("用户在杭州的一家金融科技公司工作", "context")),
        ("我是一名数据工程师", ("用户是数据工程师", "context")),
        ("我喜欢简洁的中文回答。", ("用户喜欢简洁的中文回答", "preference")),
        ("我不喜欢冗长的回答", ("用户不喜欢冗长的回答", "preference")),
        ("我更喜欢用表格", ("用户更喜欢用表格", "preference")),
        ("我想学习Rust", ("用户想学习Rust", "goal")),
        ("我的目标是今年通过注册会计师考试。", ("用户的目标是今年通过注册会计师考试", "goal")),
    ],
)
def test_explicit_statements_are_caught(text: str, expected: tuple[str, str]) -> None:
    assert facts_of(text) == [expected]


def test_several_clauses_in_one_message() -> None:
    assert facts_of("My name is Ana and I live in Lisbon, but I prefer working remotely.") == [
        ("User's name is Ana", "context"),
        ("User lives in Lisbon", "context"),
        ("User prefers working remotely", "preference"),
    ]
    assert facts_of("I like salt and pepper") == [("User likes salt and pepper", "preference")]


@pytest.mark.parametrize(
    "text",
    [
        "I'm a little confused.",
        "Do you think I want to learn Rust?",
        "我想知道明天的天气",
        "我是说你应该先写测试",
        "你喜欢Python吗",
        "We moved to Postgres last year.",
        "What is the capital of France?",
    ],
)
def test_non_statements_are_ignored(text: str) -> None:
    assert facts_of(text) == []


def test_only_human_turns_are_read() -> None:
    messages = [
        {"role": "assistant", "content": "I prefer tabs."},
        {"role": "system", "content": "I work at OpenAI."},
        {
            "role": "user",
            "content": "<uploaded_files>I work at Upload Corp.</uploaded_files>I prefer spaces.",
        },
    ]
    assert [f.content for f in extract_findings(messages)] == ["User prefers spaces"]


def test_correction_needs_a_signal() -> None:
    assert facts_of("Use Alembic instead of raw DDL.") == []
    findings = extract_findings(said("That's wrong, use Alembic migrations instead of hand-written DDL."))
    assert [(f.content, f.category, f.confidence, f.source_error) for f in findings] == [
        (
            "Use Alembic migrations instead of hand-written DDL",
            "correction",
            0.95,
            "Used hand-written DDL instead of Alembic migrations",
        )
    ]


def test_correction_from_callers_flag_and_without_a_stated_mistake() -> None:
    findings = extract_findings(said("Please use uv instead."), correction_detected=True)
    assert [(f.content, f.source_error) for f in findings] == [("Use uv instead", None)]
    findings = extract_findings(said("Don't use pip, use uv instead."), correction_detected=True)
    assert [(f.content, f.source_error) for f in findings] == [
        ("Use uv instead of pip", "Used pip instead of uv")
    ]


def test_chinese_corrections() -> None:
    findings = extract_findings(said("不对，不要用pip，改用uv"))
    assert [(f.content, f.source_error) for f in findings] == [("应使用uv，而不是pip", "使用了pip")]
    findings = extract_findings(said("改用Makefile吧"))
    assert [(f.content, f.source_error) for f in findings] == [("应使用Makefile", None)]
    findings = extract_findings(said("错了，用uv而不是pip"))
    assert [(f.content, f.source_error) for f in findings] == [("应使用uv，而不是pip", "使用了pip")]


def test_duplicates_across_turns_are_collapsed() -> None:
    assert facts_of("I prefer tabs.", "i prefer TABS") == [("User prefers tabs", "preference")]


def test_update_has_the_normalised_shape() -> None:
    reply = extract_update(said("I work at Acme.", "I prefer Python.", "I want to learn Go."))
    raw = reply
    assert set(raw) == {
        "user", "history", "newFacts", "factsToRemove", "staleFactsToRemove", "factsToConsolidate"
    }  # fmt: skip
    assert raw["factsToRemove"] == []
    assert all(not section["shouldUpdate"] for section in raw["history"].values())
    update = reply
    assert update["user"]["workContext"] == {"summary": "User works at Acme.", "shouldUpdate": True}
    assert update["user"]["personalContext"]["summary"] == "User prefers Python."
    assert update["user"]["topOfMind"]["summary"] == "User wants to learn Go."
    assert all(fact["confidence"] >= 0.7 for fact in update["newFacts"])


def test_never_proposes_stale_removals_or_consolidations() -> None:
    """Both need judgement the rules do not have, even when every fact is aged and one category is crowded."""
    memory = create_empty_memory()
    memory["facts"] = [
        {"id": f"fact_{i:08x}", "content": f"User likes topic {i}", "category": "preference",
         "confidence": 0.8, "createdAt": "2020-01-01T00:00:00Z"}
        for i in range(12)
    ]  # fmt: skip
    turns = said("I no longer like topic 3.", "I prefer Python.", "Forget the old facts.")
    reply = extract_update(turns, memory)
    assert reply["staleFactsToRemove"] == [] and reply["factsToConsolidate"] == []
    assert [fact["content"] for fact in reply["newFacts"]] == ["User prefers Python"]


def test_nothing_found_updates_no_section() -> None:
    raw = extract_update(said("What time is it?"))
    assert raw["newFacts"] == []
    assert all(not section["shouldUpdate"] for section in raw["user"].values())


def test_summaries_extend_the_stored_ones() -> None:
    memory = create_empty_memory()
    memory["user"]["personalContext"]["summary"] = "User's name is Ana. User prefers Python."
    raw = extract_update(said("I prefer Python.", "I live in Lisbon."), memory)
    assert (
        raw["user"]["personalContext"]["summary"]
        == "User's name is Ana. User prefers Python. User lives in Lisbon."
    )
    raw = extract_update(said("I prefer Python."), memory)
    assert raw["user"]["personalContext"] == {"summary": "", "shouldUpdate": False}


def test_every_fact_passes_the_default_threshold_when_applied() -> None:
    reply = extract_update(
        said("I'm a designer. I like jazz. I need to renew my passport. 我喜欢茶。"),
        correction_detected=False,
    )
    result = apply_updates(create_empty_memory(), reply, thread_id="t", config=MemoryConfig()).memory
    assert len(result["facts"]) == 4


def test_a_clause_with_an_implied_subject_reads_as_its_own_statement() -> None:
    # Issue 14.9: "User works at Acme and prefer Python" was the old, ungrammatical fact.
    assert facts_of("I work at Acme and prefer Python.") == [
        ("User works at Acme", "context"),
        ("User prefers Python", "preference"),
    ]
    assert facts_of("So I live in Lisbon and love surfing.") == [
        ("User lives in Lisbon", "context"),
        ("User loves surfing", "preference"),
    ]
    # Only the user's own statements are split: a third-person subject stays unmatched.
    assert facts_of("Bob and Alice work at Acme.") == []
    assert facts_of("I like tea and biscuits.") == [("User likes tea and biscuits", "preference")]
