"""Record fields through extraction, end to end: the real ``openai`` client, the local server, both dialects.

What the extractor's reply gives a fact (type, importance, tags, source kind, raw, structured),
the relations the update writes (``supersedes`` for a replacement, ``derived_from`` for a merge,
``contradicts`` from adjudication), the importance threshold, and the near-duplicate adjudication
with its fail-closed path. Assertions read the loaded document, which is what every provider
promises whatever it keeps in columns.
"""

from __future__ import annotations

import html
import json
import logging
import re
from typing import Any

import pytest
from sqlalchemy import text

from memstore.config import MemoryConfig
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.update.updater import MemoryUpdater
from tests.reliability.llm_script import update_reply, user_prompt
from tests.support.openai_server import OpenAIStubServer, ScriptedError
from tests.support.semantic import doc, fact, json_value, vector_rows

TURN = [{"role": "user", "content": "Please keep it short."}, {"role": "assistant", "content": "Sure."}]
FULL: dict[str, Any] = {
    "content": "User prefers concise answers",
    "category": "preference",
    "confidence": 0.9,
    "type": "procedural",
    "importance": 0.8,
    "tags": ["tone", "style"],
    "sourceKind": "explicit_user_input",
    "raw": "Please keep it short.",
    "structured": {"tone": ["concise"], "priority": "high"},
}


def with_llm(config: MemoryConfig, server: OpenAIStubServer, **settings: Any) -> None:
    config.llm_base_url = server.base_url
    config.model_name = "test-chat"
    config.extractor = "llm"
    for name, value in settings.items():
        setattr(config, name, value)


def update(user_id: str = "alice") -> bool:
    return MemoryUpdater().update_memory(TURN, thread_id="t-1", user_id=user_id)


def facts_by_content(storage: SqlMemoryStorage, user_id: str = "alice") -> dict[str, dict[str, Any]]:
    return {f["content"]: f for f in storage.load(user_id=user_id)["facts"]}


def history_details(storage: SqlMemoryStorage, fact_id: str) -> list[dict[str, Any]]:
    with get_engine(storage.url).connect() as conn:
        rows = conn.execute(
            text(
                "SELECT detail FROM memory_history WHERE entity_id = :id AND detail IS NOT NULL ORDER BY id"
            ),
            {"id": fact_id},
        ).scalars()
        return [json_value(row) for row in rows]


# --- the fields a reply gives ---------------------------------------------------------------------


def test_every_field_of_a_reply_reaches_the_stored_fact(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    with_llm(isolated_config, openai_server)
    plain = {"content": "User works at Acme", "category": "context", "confidence": 0.9}
    openai_server.script(update_reply([FULL, plain]))
    assert update()
    stored = facts_by_content(sql_storage)
    full = stored["User prefers concise answers"]
    assert {key: full[key] for key in ("type", "importance", "sourceKind", "raw", "structured")} == {
        "type": "procedural",
        "importance": 0.8,
        "sourceKind": "explicit_user_input",
        "raw": "Please keep it short.",
        "structured": {"tone": ["concise"], "priority": "high"},
    }
    assert sorted(full["tags"]) == ["style", "tone"]
    # A fact the reply said nothing more about carries no record key at all.
    assert set(stored["User works at Acme"]) == {
        "id",
        "content",
        "category",
        "confidence",
        "createdAt",
        "source",
    }
    [body] = openai_server.requests
    assert '"importance"' in body["messages"][0]["content"]


@pytest.mark.parametrize(
    ("slip", "stored"),
    [
        ({"type": "memory"}, {"type": None}),
        ({"type": "PROCEDURAL"}, {"type": "procedural"}),
        ({"importance": 2}, {"importance": 1.0}),
        ({"importance": "0.8"}, {"importance": 0.8}),
        ({"tags": [f"t{i:02}" for i in range(17)]}, {"tags": [f"t{i:02}" for i in range(16)]}),
        ({"tags": ["tone", "a,b"]}, {"tags": ["tone"]}),
        ({"raw": "x" * 4_001}, {"raw": "x" * 4_000}),
        ({"structured": {"a": {"b": {"c": {"d": {"e": 1}}}}}}, {"structured": None}),
        ({"sourceKind": "system_generated"}, {"sourceKind": None}),
    ],
    ids=[
        "type",
        "type-case",
        "importance",
        "importance-text",
        "17-tags",
        "bad-tag",
        "huge-raw",
        "deep-structured",
        "source-kind",
    ],
)
def test_a_slip_in_an_optional_field_costs_the_field_not_the_fact_nor_the_reply(
    sql_storage: SqlMemoryStorage,
    isolated_config: MemoryConfig,
    openai_server: OpenAIStubServer,
    slip: dict[str, Any],
    stored: dict[str, Any],
) -> None:
    with_llm(isolated_config, openai_server)
    sql_storage.save(doc(fact("fact_00000001", "User lives in Oslo")), user_id="alice")
    plain = {"content": "User works at Acme", "category": "context", "confidence": 0.9}
    openai_server.script(update_reply([{**FULL, **slip}, plain], remove=["fact_00000001"]))
    assert update()  # applied whole: the removal comes with every fact the reply gave
    facts = facts_by_content(sql_storage)
    assert set(facts) == {"User prefers concise answers", "User works at Acme"}
    [(key, expected)] = stored.items()
    kept = facts["User prefers concise answers"]
    assert kept.get(key) == expected
    assert kept["content"] == FULL["content"] and kept["importance"] == stored.get("importance", 0.8)


def test_a_bad_confidence_still_costs_its_fact_and_with_removals_the_whole_reply(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    with_llm(isolated_config, openai_server)
    sql_storage.save(doc(fact("fact_00000001", "User lives in Oslo")), user_id="alice")
    plain = {"content": "User works at Acme", "category": "context", "confidence": 0.9}
    openai_server.script(update_reply([{**FULL, "confidence": "high"}, plain], remove=["fact_00000001"]))
    assert not update()  # refused as a whole: the removal must not apply without its replacement
    assert set(facts_by_content(sql_storage)) == {"User lives in Oslo"}


def test_the_importance_threshold_drops_what_matters_less_counting_an_unstated_importance_as_half(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    with_llm(isolated_config, openai_server, fact_importance_threshold=0.6)
    base = {"category": "context", "confidence": 0.9}
    openai_server.script(
        update_reply(
            [
                {**base, "content": "User owns a red umbrella", "importance": 0.3},
                {**base, "content": "User is on holiday this week"},
                {**base, "content": "User is allergic to peanuts", "importance": 0.95},
            ]
        )
    )
    assert update()
    assert set(facts_by_content(sql_storage)) == {"User is allergic to peanuts"}


def test_the_rules_extractor_stores_the_users_sentence_and_what_it_can_tell(
    sql_storage: SqlMemoryStorage,
) -> None:
    said = [{"role": "user", "content": "Hi! My name is Ana. I live in Lisbon."}]
    assert MemoryUpdater().update_memory(said, thread_id="t-1", user_id="alice")
    stored = facts_by_content(sql_storage)
    name, home = stored["User's name is Ana"], stored["User lives in Lisbon"]
    assert (name["raw"], name["tags"], name["sourceKind"]) == (
        "My name is Ana.",
        ["name"],
        "explicit_user_input",
    )
    assert (home["raw"], home["tags"]) == ("I live in Lisbon.", ["location"])
    assert "type" not in name and "importance" not in name  # the defaults are not written


# --- relations the update writes ------------------------------------------------------------------


def test_a_correction_that_replaces_a_fact_supersedes_it(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    with_llm(isolated_config, openai_server)
    sql_storage.save(
        doc(
            fact("fact_00000001", "Use npm for this repo", 0.9, "correction"), fact("fact_00000002", "Other")
        ),
        user_id="alice",
    )
    correction = {
        "content": "Use pnpm for this repo, not npm",
        "category": "correction",
        "confidence": 0.97,
        "sourceError": "used npm",
        "replaces": ["fact_00000001", "fact_unknown"],
    }
    openai_server.script(update_reply([correction]))
    assert update()
    stored = facts_by_content(sql_storage)
    assert set(stored) == {"Other", "Use pnpm for this repo, not npm"}
    new = stored["Use pnpm for this repo, not npm"]
    assert new["relations"] == [{"type": "supersedes", "target": "fact_00000001"}]
    assert new["sourceKind"] == "corrected_memory"


@pytest.mark.parametrize(
    "refused",
    [{"confidence": 0.6}, {"importance": 0.2}],
    ids=["below-confidence", "below-importance"],
)
def test_a_replacement_that_is_not_stored_removes_nothing(
    sql_storage: SqlMemoryStorage,
    isolated_config: MemoryConfig,
    openai_server: OpenAIStubServer,
    refused: dict[str, Any],
) -> None:
    with_llm(isolated_config, openai_server, fact_importance_threshold=0.3)
    sql_storage.save(doc(fact("fact_00000001", "User prefers coffee", 0.9, "preference")), user_id="alice")
    tea = {"content": "User prefers tea", "category": "preference", "confidence": 0.9}
    openai_server.script(update_reply([{**tea, "replaces": ["fact_00000001"], **refused}]))
    assert update()
    [kept] = sql_storage.load(user_id="alice")["facts"]
    assert (kept["id"], kept["content"]) == ("fact_00000001", "User prefers coffee")
    assert "relations" not in kept
    # Stored, it replaces the fact and supersedes it.
    openai_server.script(update_reply([{**tea, "replaces": ["fact_00000001"]}]))
    assert update()
    [new] = sql_storage.load(user_id="alice")["facts"]
    assert new["relations"] == [{"type": "supersedes", "target": "fact_00000001"}]


def test_the_prompt_shows_stored_facts_without_raw_or_structured(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    with_llm(isolated_config, openai_server)
    openai_server.script(update_reply([FULL]), update_reply())
    assert update() and update()
    memory_block = user_prompt(openai_server.requests[1]).split("</current_memory>")[0]
    assert "User prefers concise answers" in memory_block and '"importance": 0.8' in memory_block
    assert '"structured"' not in memory_block and "priority" not in memory_block
    assert '"raw"' not in memory_block and "Please keep it short" not in memory_block


def test_the_rules_extractor_keeps_only_the_words_it_matched_and_no_upload_path(
    sql_storage: SqlMemoryStorage,
) -> None:
    said = "I work at Acme, my password is hunter2. I live in Oslo, my CV is /mnt/user-data/uploads/cv.pdf"
    assert MemoryUpdater().update_memory([{"role": "user", "content": said}], thread_id="t", user_id="alice")
    stored = facts_by_content(sql_storage)
    assert stored["User works at Acme"]["raw"] == "I work at Acme"
    assert stored["User lives in Oslo"]["raw"] == "I live in Oslo"
    loaded = json.dumps(sql_storage.load(user_id="alice"))
    assert "hunter2" not in loaded and "uploads" not in loaded


def test_consolidation_writes_derived_from_for_each_source(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    with_llm(isolated_config, openai_server, consolidation_enabled=True)
    sources = [fact(f"fact_0000000{i}", f"User knows tool {i}", 0.85, "knowledge") for i in range(8)]
    sources[0]["importance"], sources[1]["tags"] = 0.9, ["tools"]
    sql_storage.save(doc(*sources), user_id="alice")

    def merge_reply(body: dict[str, Any]) -> str:
        assert "<consolidation_candidates" in user_prompt(body)
        merge = {
            "sourceIds": ["fact_00000000", "fact_00000001", "fact_00000002"],
            "consolidated": {
                "content": "User knows tools 0 to 2",
                "category": "knowledge",
                "confidence": 0.85,
            },
        }
        return json.dumps({"user": {}, "history": {}, "newFacts": [], "factsToConsolidate": [merge]})

    openai_server.script(merge_reply)
    assert update()
    merged = facts_by_content(sql_storage)["User knows tools 0 to 2"]
    assert merged["relations"] == [{"type": "derived_from", "target": f"fact_0000000{i}"} for i in range(3)]
    assert (merged["importance"], merged["tags"]) == (0.9, ["tools"])
    assert len(facts_by_content(sql_storage)) == 6


# --- adjudication of near-duplicates --------------------------------------------------------------

# Bag-of-words vectors from the test server: each new text repeats a stored one plus one word, so
# the pairs score 0.89-0.93, between adjudication_similarity (0.85) and dedup_similarity (0.97).
STORED = {
    "fact_0000000a": "User works at Acme",
    "fact_0000000b": "User likes green tea",
    "fact_0000000c": "User drinks black coffee every morning",
    "fact_0000000d": "User plays chess online",
}
NEW = {
    "User works at Acme Robotics": "update",
    "User likes green tea daily": "skip",
    "User never drinks black coffee every morning": "contradicts",
    "User plays chess online weekly": "add",
}
_NEW_LINE = re.compile(r'^  new \[[^\]]*\]: "(.*)"$', re.MULTILINE)


def adjudicating_llm(decide: dict[str, str] | str | ScriptedError) -> Any:
    """The update reply with the four new facts, then ``decide`` (by new content) for the pairs."""

    def reply(body: dict[str, Any]) -> str | ScriptedError:
        prompt = user_prompt(body)
        if "<near_duplicates>" not in prompt:
            return update_reply([{"content": c, "category": "context", "confidence": 0.9} for c in NEW])
        if not isinstance(decide, dict):
            return decide
        shown = [html.unescape(content) for content in _NEW_LINE.findall(prompt)]
        answers = [{"pair": n, "decision": decide[content]} for n, content in enumerate(shown, start=1)]
        return json.dumps({"decisions": answers})

    return reply


@pytest.fixture
def adjudicating(
    semantic: SqlMemoryStorage, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> SqlMemoryStorage:
    with_llm(isolated_config, openai_server, dedup_similarity=0.97, adjudication_similarity=0.85)
    semantic.save(doc(*(fact(fact_id, content) for fact_id, content in STORED.items())), user_id="alice")
    return semantic


def test_the_llm_decides_each_near_duplicate_and_its_decision_is_applied(
    adjudicating: SqlMemoryStorage, openai_server: OpenAIStubServer
) -> None:
    openai_server.default_reply = adjudicating_llm(NEW)
    assert update()
    [_, asked] = openai_server.requests
    assert len(_NEW_LINE.findall(user_prompt(asked))) == 4
    stored = {f["id"]: f for f in adjudicating.load(user_id="alice")["facts"]}
    by_content = {f["content"]: f for f in stored.values()}
    # update: the stored fact takes the new text and keeps its id; skip: the new fact is dropped.
    assert stored["fact_0000000a"]["content"] == "User works at Acme Robotics"
    assert stored["fact_0000000b"]["content"] == "User likes green tea"
    assert "User likes green tea daily" not in by_content
    # contradicts: both kept, the new one says which fact it contradicts; add: both kept.
    assert by_content["User never drinks black coffee every morning"]["relations"] == [
        {"type": "contradicts", "target": "fact_0000000c"}
    ]
    assert {
        "User drinks black coffee every morning",
        "User plays chess online",
        "User plays chess online weekly",
    } <= set(by_content)
    assert len(stored) == 6
    assert [(d["reason"], d["decision"]) for d in history_details(adjudicating, "fact_0000000a")] == [
        ("adjudicated", "update")
    ]
    assert [d["decision"] for d in history_details(adjudicating, "fact_0000000b")] == ["skip"]
    # The updated fact's vector is of its new text, so the next search and dedup see it.
    assert set(vector_rows(adjudicating)) == set(stored)
    found = adjudicating.vectors.fact_vectors(
        ("alice", None), "openai:test-embed", [("fact_0000000a", "User works at Acme Robotics")]
    )
    assert set(found) == {"fact_0000000a"}


@pytest.mark.parametrize(
    "failure",
    [
        "I am not sure what you mean.",
        '{"decisions": [{"pair": 1, "decision": "destroy"}]}',
        ScriptedError(400),
    ],
    ids=["prose", "unknown-decision", "endpoint-error"],
)
def test_a_failed_adjudication_keeps_both_and_says_so(
    adjudicating: SqlMemoryStorage,
    openai_server: OpenAIStubServer,
    caplog: pytest.LogCaptureFixture,
    failure: str | ScriptedError,
) -> None:
    openai_server.default_reply = adjudicating_llm(failure)
    with caplog.at_level(logging.WARNING, logger="memstore.update.adjudication"):
        assert update()
    contents = {f["content"] for f in adjudicating.load(user_id="alice")["facts"]}
    assert contents == {*STORED.values(), *NEW}
    assert "near-duplicate adjudication (no agent) failed, 4 pair(s) kept as they are" in caplog.text


def test_adjudication_switched_off_asks_nothing_and_keeps_both(
    adjudicating: SqlMemoryStorage, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    isolated_config.adjudication_similarity = None
    openai_server.default_reply = adjudicating_llm(NEW)
    assert update()
    assert len(openai_server.requests) == 1
    assert len(adjudicating.load(user_id="alice")["facts"]) == 8


def test_a_replacement_skipped_as_a_repeat_hands_its_supersedes_to_the_stored_fact(
    adjudicating: SqlMemoryStorage, openai_server: OpenAIStubServer
) -> None:
    memory = adjudicating.load(user_id="alice")
    memory["facts"].append(fact("fact_0000000e", "User prefers espresso"))
    adjudicating.save(memory, user_id="alice")
    repeat = {"content": "User likes green tea daily", "category": "context", "confidence": 0.9}

    def reply(body: dict[str, Any]) -> str:
        if "<near_duplicates>" not in user_prompt(body):
            return update_reply([{**repeat, "replaces": ["fact_0000000e"]}])
        return json.dumps({"decisions": [{"pair": 1, "decision": "skip"}]})

    openai_server.default_reply = reply
    assert update()
    stored = {f["id"]: f for f in adjudicating.load(user_id="alice")["facts"]}
    assert set(stored) == set(STORED)  # the replaced fact is gone, the repeat was not added
    assert stored["fact_0000000b"]["content"] == "User likes green tea"
    assert stored["fact_0000000b"]["relations"] == [{"type": "supersedes", "target": "fact_0000000e"}]
    assert [d["decision"] for d in history_details(adjudicating, "fact_0000000b")] == ["skip"]
