"""What a new fact may take with it: the facts it ``replaces``, and the text it keeps beside its content.

A replaced fact is removed only when its replacement is stored (not below a threshold, not a
re-statement, not a malformed reply's sibling), and the ``supersedes`` relation is written only then;
a replacement folded or adjudicated away hands the relation to the fact that holds it. A new fact's
``raw``, ``structured`` and tags are held to the upload scrub its content is, from both extractors.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any, cast

import pytest

from memstore.config import MemoryConfig
from memstore.document import create_empty_memory
from memstore.storage.vectors import VectorStore
from memstore.update.apply import apply_updates
from memstore.update.parser import MemoryUpdate, parse_update_response
from memstore.update.rules import extract_update
from memstore.update.similarity import fold_similar
from tests.unit.test_update_adjudication import NoVectors, ScriptedDecisions, TableEmbedder, angled, at

COFFEE = {
    "id": "fact_coffee",
    "content": "User prefers coffee",
    "category": "preference",
    "confidence": 0.9,
    "createdAt": "2026-01-01T00:00:00Z",
}
TEA = {
    "content": "User prefers tea",
    "category": "preference",
    "confidence": 0.9,
    "replaces": ["fact_coffee"],
}


def reply(*facts: dict[str, Any], remove: list[str] | None = None) -> MemoryUpdate:
    body = {"user": {}, "history": {}, "newFacts": list(facts), "factsToRemove": remove or []}
    return parse_update_response(json.dumps(body))


def applied(update: MemoryUpdate, *stored: dict[str, Any], **settings: Any) -> list[dict[str, Any]]:
    memory = create_empty_memory()
    memory["facts"] = [dict(f) for f in stored] or [dict(COFFEE)]
    return list(apply_updates(memory, update, thread_id="t", config=MemoryConfig(**settings)).memory["facts"])


# --- replaces -------------------------------------------------------------------------------------


def test_a_stored_replacement_removes_what_it_replaces_and_supersedes_it() -> None:
    [tea] = applied(reply(TEA))
    assert tea["content"] == "User prefers tea"
    assert tea["relations"] == [{"type": "supersedes", "target": "fact_coffee"}]


@pytest.mark.parametrize(
    ("change", "settings"),
    [
        ({"confidence": 0.6}, {}),  # the prompt's "inferred" band, below the 0.7 threshold
        ({"confidence": -1}, {}),
        ({"importance": 0.2}, {"fact_importance_threshold": 0.3}),
        ({"content": "  user PREFERS coffee "}, {}),  # a re-statement of the fact it replaces
    ],
    ids=["confidence", "negative-confidence", "importance", "restatement"],
)
def test_a_replacement_that_is_not_stored_removes_nothing(change: dict[str, Any], settings: Any) -> None:
    facts = applied(reply({**TEA, **change}), **settings)
    assert facts == [COFFEE]  # unchanged: no relation written either


def test_a_replacement_not_stored_leaves_its_target_even_beside_a_stored_sibling() -> None:
    other = {"content": "User works at Acme", "category": "context", "confidence": 0.9}
    facts = applied(reply({**TEA, "confidence": 0.5}, other))
    assert [f["content"] for f in facts] == ["User prefers coffee", "User works at Acme"]
    assert all("relations" not in f for f in facts)


def test_replaces_alone_no_longer_makes_a_malformed_sibling_refuse_the_reply() -> None:
    # The removal is bound to its stored replacement, so there is no "forget X" to refuse.
    update = reply(TEA, {"content": None, "confidence": 0.9})
    assert update["factsToRemove"] == []
    assert [f["content"] for f in applied(update)] == ["User prefers tea"]


def test_facts_to_remove_still_removes_as_the_reference_does() -> None:
    facts = applied(reply({**TEA, "confidence": 0.5}, remove=["fact_coffee"]))
    assert facts == []


def fold_with(table: dict[str, Any], decide: ScriptedDecisions | None) -> Any:
    return partial(
        fold_similar,
        embedder=TableEmbedder(table),
        store=cast(VectorStore, NoVectors()),
        scope=("alice", None),
        config=MemoryConfig(dedup_similarity=0.97, adjudication_similarity=0.85),
        adjudicate=decide,
    )


HOT = {
    "id": "fact_hot",
    "content": "User likes tea",
    "category": "preference",
    "confidence": 0.8,
    "createdAt": "2026-01-01T00:00:00Z",
}


@pytest.mark.parametrize(
    ("similarity", "decision"), [(0.99, None), (0.9, "skip"), (0.9, "update")], ids=["fold", "skip", "update"]
)
def test_a_replacement_folded_or_adjudicated_away_hands_its_supersedes_to_the_fact_that_holds_it(
    similarity: float, decision: str | None
) -> None:
    table = {
        "User likes tea": angled(0),
        "User prefers tea": at(similarity),
        "User prefers coffee": angled(90),
    }
    decide = ScriptedDecisions({"User prefers tea": decision}) if decision else None
    memory = create_empty_memory()
    memory["facts"] = [dict(COFFEE), dict(HOT)]
    result = apply_updates(
        memory, reply(TEA), thread_id="t", config=MemoryConfig(), fold=fold_with(table, decide)
    )
    [held] = result.memory["facts"]
    assert held["id"] == "fact_hot"
    assert held["relations"] == [{"type": "supersedes", "target": "fact_coffee"}]
    assert [d.get("decision") for d in result.folds.folded["fact_hot"]] == [decision]


# --- the upload scrub -----------------------------------------------------------------------------

UPLOAD_PATH = "/mnt/user-data/uploads/cv.pdf"


def test_the_rules_extractor_keeps_no_upload_path_from_the_rest_of_the_message() -> None:
    said = f"I work at Acme, my CV is at {UPLOAD_PATH}"
    update = extract_update([{"role": "user", "content": said}, {"role": "assistant", "content": "ok"}])
    facts = applied(update)
    [acme] = [f for f in facts if f["content"] == "User works at Acme"]
    assert acme["raw"] == "I work at Acme"
    assert all("uploads" not in json.dumps(f) for f in facts)


def test_an_llm_facts_raw_structured_and_tags_are_scrubbed_of_uploads_and_the_fact_kept() -> None:
    fact = {
        "content": "User works at Acme",
        "category": "context",
        "confidence": 0.9,
        "raw": f"I work at Acme, see my uploaded file {UPLOAD_PATH}",
        "structured": {"employer": "Acme", "cv": [UPLOAD_PATH]},
        "tags": ["work", "uploaded cv file", "<uploaded_files>"],
    }
    keyed = {
        **fact,
        "content": "User lives in Oslo",
        "raw": f"I live in Oslo: {UPLOAD_PATH}",  # a bare path after a space counts too
        "structured": {f"{UPLOAD_PATH}": "x"},  # and so does a key
        "tags": ["home"],
    }
    clean = {**fact, "content": "User plays chess", "raw": "I play chess", "structured": {"game": "chess"}}
    by_content = {f["content"]: f for f in applied(reply(fact, keyed, clean))}
    acme = by_content["User works at Acme"]
    assert "raw" not in acme and "structured" not in acme and acme["tags"] == ["work"]
    oslo = by_content["User lives in Oslo"]
    assert "raw" not in oslo and "structured" not in oslo and oslo["tags"] == ["home"]
    chess = by_content["User plays chess"]
    assert (chess["raw"], chess["structured"]) == ("I play chess", {"game": "chess"})
    assert chess["tags"] == ["work"]
    assert all("upload" not in json.dumps(f) for f in by_content.values())


def test_a_fact_left_with_no_clean_tag_stores_none() -> None:
    fact = {"content": "User likes chess", "confidence": 0.9, "tags": ["uploaded file", "file upload"]}
    [stored] = applied(
        reply(fact), {"id": "fact_x", "content": "Other", "category": "context", "confidence": 1}
    )[1:]
    assert "tags" not in stored
