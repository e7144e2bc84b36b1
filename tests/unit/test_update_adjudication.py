"""Near-duplicate adjudication: the prompt's escaping, the reply's strict reading, the decisions applied.

The end-to-end path (the real client, the local server, both SQL dialects) is in
``tests/integration/test_record_extraction.py``; here the embedder is a table of chosen vectors,
so each pair's similarity is exact.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstore.config import MemoryConfig
from memstore.document import create_empty_memory
from memstore.errors import LLMUnavailableError, MemoryUpdateParseError
from memstore.storage.vectors import VectorStore
from memstore.update.adjudication import (
    Adjudicator,
    NearPair,
    build_adjudication_prompt,
    parse_decisions,
)
from memstore.update.similarity import SimilarFolds, fold_similar

Fact = dict[str, Any]


def angled(degrees: float) -> np.ndarray:
    """A unit vector whose cosine with ``angled(0)`` is ``cos(degrees)``."""
    radians = math.radians(degrees)
    return np.array([math.cos(radians), math.sin(radians), 0.0], dtype=np.float32)


def at(similarity: float) -> np.ndarray:
    """A unit vector at exactly ``similarity`` to ``angled(0)``."""
    return angled(math.degrees(math.acos(similarity)))


ORTHOGONAL = np.array([0.0, 0.0, 1.0], dtype=np.float32)


class TableEmbedder:
    model = "test:table"

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table
        self.calls = 0

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        return np.stack([self.table.get(text, ORTHOGONAL) for text in texts])

    def embed_query(self, text: str) -> np.ndarray:
        return self.table.get(text, ORTHOGONAL)


class NoVectors:
    """A vector store that holds nothing yet: every fact is embedded in the call."""

    def fact_vectors(self, scope: Any, model: str, facts: Sequence[tuple[str, str]]) -> dict[str, np.ndarray]:
        return {}


class ScriptedDecisions:
    """An ``Adjudicate`` that answers from a table by new content (``add`` when absent)."""

    def __init__(self, decisions: dict[str, str]) -> None:
        self.decisions = decisions
        self.asked: list[list[NearPair]] = []

    def __call__(self, pairs: Sequence[NearPair]) -> list[str]:
        self.asked.append(list(pairs))
        return [self.decisions.get(str(pair.new["content"]), "add") for pair in pairs]


def fact(fact_id: str, content: str, category: str = "preference", **extra: Any) -> Fact:
    return {"id": fact_id, "content": content, "category": category, "confidence": 0.8, **extra}


def fold(
    stored: list[Fact],
    new: list[Fact],
    table: dict[str, np.ndarray],
    adjudicate: ScriptedDecisions | None,
    **settings: Any,
) -> SimilarFolds:
    current = create_empty_memory()
    current["facts"] = stored
    memory = create_empty_memory()
    memory["facts"] = [dict(f) for f in stored] + new
    config = MemoryConfig(dedup_similarity=0.97, adjudication_similarity=0.85, **settings)
    return fold_similar(
        current,
        memory,
        embedder=TableEmbedder(table),
        store=cast(VectorStore, NoVectors()),
        scope=("alice", None),
        config=config,
        adjudicate=adjudicate,
    )


LIKES = fact("fact_old", "User likes coffee", tags=["drinks"], raw="I like coffee")
TABLE = {
    "User likes coffee": angled(0),
    "User does not like coffee": at(0.9),
    "User likes coffee a lot": at(0.93),
    "User likes black coffee": at(0.88),
    "User works at Acme": ORTHOGONAL,
}


def by_id(folds: SimilarFolds) -> dict[str, Fact]:
    return {str(f["id"]): f for f in folds.memory["facts"]}


# --- decisions applied --------------------------------------------------------------------------


def test_update_moves_the_new_text_into_the_stored_fact_and_keeps_its_id() -> None:
    new = fact("fact_new", "User likes coffee a lot", importance=0.9, sourceKind="explicit_user_input")
    folds = fold([LIKES], [new], TABLE, ScriptedDecisions({"User likes coffee a lot": "update"}))
    assert set(by_id(folds)) == {"fact_old"}
    updated = by_id(folds)["fact_old"]
    assert updated["content"] == "User likes coffee a lot" and updated["importance"] == 0.9
    assert updated["sourceKind"] == "explicit_user_input"
    assert "raw" not in updated  # the old text's words
    assert updated["tags"] == ["drinks"]  # the new fact states none, so the stored fact's still hold
    [detail] = folds.folded["fact_old"]
    assert (detail["reason"], detail["decision"]) == ("adjudicated", "update")
    assert detail["similarity"] == pytest.approx(0.93, abs=1e-3)
    # The vector made for the new text is stored under the fact that now holds it.
    assert [(fact_id, text) for fact_id, text, _ in folds.vectors] == [
        ("fact_old", "User likes coffee a lot")
    ]


def test_skip_drops_the_new_fact_and_confirms_the_stored_one_unchanged() -> None:
    new = fact("fact_new", "User likes coffee a lot")
    folds = fold([LIKES], [new], TABLE, ScriptedDecisions({"User likes coffee a lot": "skip"}))
    assert by_id(folds) == {"fact_old": LIKES}
    assert [d["decision"] for d in folds.folded["fact_old"]] == ["skip"]
    assert [fact_id for fact_id, _, _ in folds.vectors] == ["fact_old"]  # the stored fact's own, made now


def test_contradicts_keeps_both_and_relates_the_new_fact_to_the_old() -> None:
    new = fact("fact_new", "User does not like coffee")
    folds = fold([LIKES], [new], TABLE, ScriptedDecisions({"User does not like coffee": "contradicts"}))
    facts = by_id(folds)
    assert facts["fact_old"] == LIKES and folds.folded == {}
    assert facts["fact_new"]["relations"] == [{"type": "contradicts", "target": "fact_old"}]


def test_add_keeps_both_untouched() -> None:
    new = fact("fact_new", "User likes black coffee")
    folds = fold([LIKES], [new], TABLE, ScriptedDecisions({}))
    assert by_id(folds) == {"fact_old": LIKES, "fact_new": new} and folds.folded == {}


@pytest.mark.parametrize("decision", ["update", "skip"])
@pytest.mark.parametrize("correction_is_new", [True, False], ids=["new-correction", "stored-correction"])
def test_an_update_or_skip_across_the_correction_line_keeps_both(
    decision: str, correction_is_new: bool
) -> None:
    if correction_is_new:
        stored, new = LIKES, fact("fact_new", "User likes coffee a lot", "correction")
    else:
        stored, new = {**LIKES, "category": "correction"}, fact("fact_new", "User likes coffee a lot")
    folds = fold([stored], [new], TABLE, ScriptedDecisions({"User likes coffee a lot": decision}))
    assert by_id(folds) == {"fact_old": stored, "fact_new": new} and folds.folded == {}


@pytest.mark.parametrize("decision", ["skip", "update"])
def test_a_fold_into_a_new_fact_follows_it_to_the_stored_fact_it_became(decision: str) -> None:
    table = {**TABLE, "User likes coffee a lot!": at(0.93)}  # the same vector as n1: folds into it
    n1 = fact("fact_n1", "User likes coffee a lot")
    n2 = fact("fact_n2", "User likes coffee a lot!", confidence=0.95)
    folds = fold([LIKES], [n1, n2], table, ScriptedDecisions({"User likes coffee a lot": decision}))
    assert set(by_id(folds)) == {"fact_old"} and set(folds.folded) == {"fact_old"}
    details = folds.folded["fact_old"]
    assert [(d["reason"], d.get("decision"), d["content"]) for d in details] == [
        ("similar", None, "User likes coffee a lot!"),
        ("adjudicated", decision, "User likes coffee a lot"),
    ]
    # The folded fact's confidence is not lost: the stored fact takes the higher one, as a fold target.
    assert by_id(folds)["fact_old"]["confidence"] == 0.95


def test_a_replacement_skipped_or_folded_hands_its_supersedes_to_the_fact_kept() -> None:
    supersedes = [{"type": "supersedes", "target": "fact_gone"}]
    table = {**TABLE, "User likes coffee!": at(0.99)}
    skipped = fact("fact_a", "User likes coffee a lot", relations=supersedes)
    folded = fact("fact_b", "User likes coffee!", relations=supersedes)
    for new in (skipped, folded):
        folds = fold([LIKES], [new], table, ScriptedDecisions({"User likes coffee a lot": "skip"}))
        assert set(by_id(folds)) == {"fact_old"}
        assert by_id(folds)["fact_old"]["relations"] == supersedes


# --- which pairs are asked about ----------------------------------------------------------------


def test_only_pairs_between_the_thresholds_are_asked_and_a_fold_still_folds() -> None:
    table = {**TABLE, "User likes coffee!": at(0.99), "User likes tea": at(0.5)}
    decide = ScriptedDecisions({})
    new = [fact("fact_a", "User likes coffee!"), fact("fact_b", "User likes tea")]
    folds = fold([LIKES], new, table, decide)
    assert decide.asked == []  # 0.99 folded, 0.5 too far
    assert [d["reason"] for d in folds.folded["fact_old"]] == ["similar"]


def test_a_stored_fact_is_in_one_pair_the_closest_and_the_pairs_are_capped() -> None:
    axis = np.eye(6, dtype=np.float32)

    def near(similarity: float, to: int, aside: int) -> np.ndarray:
        vector: np.ndarray = similarity * axis[to] + math.sqrt(1 - similarity**2) * axis[aside]
        return vector

    table = {
        "User likes coffee": axis[0],
        "User likes coffee a lot": near(0.93, 0, 1),
        "User likes black coffee": near(0.88, 0, 2),  # also closest to the first, which is taken
        "stored 0": axis[3],
        "new 0": near(0.9, 3, 4),
        "stored 1": axis[5],
        "new 1": near(0.86, 5, 4),
    }
    stored = [fact("fact_old", "User likes coffee"), fact("fact_s0", "stored 0"), fact("fact_s1", "stored 1")]
    new = [
        fact("fact_n1", "User likes coffee a lot"),
        fact("fact_n2", "User likes black coffee"),
        fact("fact_x0", "new 0"),
        fact("fact_x1", "new 1"),
    ]
    decide = ScriptedDecisions({})
    fold(stored, new, table, decide, adjudication_max_candidates=2)
    [pairs] = decide.asked
    assert [(p.new["id"], p.old["id"]) for p in pairs] == [("fact_n1", "fact_old"), ("fact_x0", "fact_s0")]


def test_shared_facts_and_facts_of_the_same_update_are_never_candidates() -> None:
    shared = fact("fact_old", "User likes coffee", visibility="shared", allowedUsers=["bob"])
    decide = ScriptedDecisions({})
    fold([shared], [fact("fact_new", "User likes coffee a lot")], TABLE, decide)
    both_new = [fact("fact_a", "User likes coffee"), fact("fact_b", "User likes coffee a lot")]
    fold([], both_new, TABLE, decide)
    assert decide.asked == []


def test_without_an_adjudicator_or_a_threshold_nothing_is_asked() -> None:
    new = fact("fact_new", "User likes coffee a lot")
    assert set(by_id(fold([LIKES], [new], TABLE, None))) == {"fact_old", "fact_new"}
    decide = ScriptedDecisions({"User likes coffee a lot": "skip"})
    current = create_empty_memory()
    current["facts"] = [LIKES]
    memory = create_empty_memory()
    memory["facts"] = [dict(LIKES), new]
    fold_similar(
        current,
        memory,
        embedder=TableEmbedder(TABLE),
        store=cast(VectorStore, NoVectors()),
        scope=("alice", None),
        config=MemoryConfig(adjudication_similarity=None),
        adjudicate=decide,
    )
    assert decide.asked == []


# --- the prompt ---------------------------------------------------------------------------------

LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
hostile = st.text(alphabet=st.sampled_from("<>&\"'|[]/= ab\n\u2028") | st.characters(), max_size=60)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(hostile, hostile)
def test_no_fact_text_adds_a_tag_a_line_or_a_quote_to_the_prompt(content: str, category: str) -> None:
    pairs = [NearPair(fact("fact_1", f"o {content}", f"k {category}"), fact("fact_2", f"n {content}"), 0.9)]
    [system, user] = build_adjudication_prompt(pairs)
    text = user["content"]
    assert text.count("<near_duplicates>") == text.count("</near_duplicates>") == 1
    remainder = text.replace("<near_duplicates>", "").replace("</near_duplicates>", "")
    assert "<" not in remainder and ">" not in remainder
    lines = text.splitlines()
    block = lines[lines.index("<near_duplicates>") + 1 : lines.index("</near_duplicates>")]
    assert len(block) == 3 and block[0] == "- pair 1 (similarity 0.90)"
    for line in block[1:]:
        assert re.fullmatch(r'  (stored|new) \[[^\[\]|"<>]*\]: "[^"<>]*"', line), line
    assert "fact_1" not in text  # ids are not the model's business here
    assert "near_duplicates" in system["content"]


# --- the reply ----------------------------------------------------------------------------------


def decisions(*entries: Any) -> str:
    return json.dumps({"decisions": list(entries)})


def test_a_reply_gives_one_decision_per_pair_and_a_missing_pair_is_add() -> None:
    answer = decisions({"pair": 3, "decision": "skip"}, {"pair": 1, "decision": "update"})
    reply = f"<think>{{</think>```json\n{answer}```"
    assert parse_decisions(reply, 3) == ["update", "add", "skip"]
    assert parse_decisions(decisions(), 2) == ["add", "add"]


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "no JSON here",
        '{"decision": []}',
        '{"decisions": "skip"}',
        decisions({"pair": 4, "decision": "skip"}),
        decisions({"pair": 0, "decision": "skip"}),
        decisions({"pair": True, "decision": "skip"}),
        decisions({"pair": "1", "decision": "skip"}),
        decisions({"pair": 1, "decision": "delete"}),
        decisions({"pair": 1, "decision": None}),
        decisions({"pair": 1, "decision": "skip"}, {"pair": 1, "decision": "add"}),
        decisions({"pair": 1, "decision": "add"}, "skip"),
        "{" * 2_000_000,
    ],
    ids=lambda reply: reply[:40] or "empty",
)
def test_any_malformed_part_makes_the_whole_reply_malformed(reply: str) -> None:
    with pytest.raises(MemoryUpdateParseError):
        parse_decisions(reply, 3)


class ScriptedClient:
    def __init__(self, *replies: str | Exception) -> None:
        self.replies = list(replies)
        self.prompts: list[list[dict[str, str]]] = []

    def complete(self, messages: list[dict[str, str]]) -> str:
        self.prompts.append(messages)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


PAIRS = [NearPair(fact(f"fact_o{i}", f"old {i}"), fact(f"fact_n{i}", f"new {i}"), 0.9) for i in range(2)]


@pytest.mark.parametrize(
    "failure",
    [
        LLMUnavailableError("endpoint down: it said 'User likes coffee'"),
        decisions({"pair": 1, "decision": "skip"}, {"pair": 2, "decision": "destroy"}),
        RuntimeError("a bug"),
    ],
    ids=["endpoint", "malformed", "bug"],
)
def test_the_adjudicator_fails_closed_to_keep_both_and_logs_without_the_text(
    failure: str | Exception, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="memstore.update.adjudication"):
        assert Adjudicator(ScriptedClient(failure), "alice")(PAIRS) == ["add", "add"]
    [record] = caplog.records
    assert "alice" in record.getMessage() and "2 pair(s) kept" in record.getMessage()
    assert "coffee" not in record.getMessage()


def test_the_adjudicator_asks_once_per_pair_across_retries() -> None:
    client = ScriptedClient(
        decisions({"pair": 1, "decision": "skip"}, {"pair": 2, "decision": "update"}),
        decisions({"pair": 1, "decision": "contradicts"}),
    )
    adjudicate = Adjudicator(client, "alice")
    assert adjudicate(PAIRS) == ["skip", "update"]
    assert adjudicate(PAIRS) == ["skip", "update"] and len(client.prompts) == 1
    third = NearPair(fact("fact_o9", "old 9"), fact("fact_n9", "new 9"), 0.88)
    assert adjudicate([PAIRS[1], third]) == ["update", "contradicts"]
    assert len(client.prompts) == 2 and "new 9" in client.prompts[1][-1]["content"]
    assert "new 1" not in client.prompts[1][-1]["content"]
