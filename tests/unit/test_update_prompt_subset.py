"""A large scope's update prompt shows a bounded subset, and the reply may act only on what it showed.

``update_prompt_max_facts`` (default 200) bounds the facts in ``<current_memory>``: a quarter for
the guaranteed categories (corrections), a quarter for the newest, the rest by BM25 relevance to the
conversation. ``apply_updates(shown=...)`` ignores removals, replacements and merges of other ids.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from memstore.config import MemoryConfig
from memstore.document import create_empty_memory, format_timestamp
from memstore.update.apply import apply_updates
from memstore.update.parser import MemoryUpdate
from memstore.update.prompt import build_update_prompt, select_prompt_facts, shown_fact_ids

START = datetime(2026, 1, 1, tzinfo=UTC)
NOW = datetime(2026, 9, 1, tzinfo=UTC)
TOPICS = ("gardening", "chess", "cycling", "pottery", "sailing", "baking", "astronomy", "knitting")
CONVERSATION = [
    {"role": "user", "content": "I finally moved my Kubernetes cluster to the Hetzner datacenter"},
    {"role": "assistant", "content": "Congratulations on the migration."},
]
RELEVANT = {f"fact_{i:04d}" for i in (17, 333, 640)}
"""The only facts about Kubernetes or Hetzner, all old: relevance alone can bring them in."""


def _fact(i: int, category: str = "context") -> dict[str, Any]:
    fact_id = f"fact_{i:04d}"
    topic = TOPICS[i % len(TOPICS)]
    content = f"The user enjoys {topic} on weekends, note {i}"
    if fact_id in RELEVANT:
        content = f"The user runs a Kubernetes cluster on Hetzner servers (note {i})"
    return {
        "id": fact_id,
        "content": content,
        "category": category,
        "confidence": 0.8,
        "createdAt": format_timestamp(START + timedelta(hours=i)),
    }


def _memory(count: int, corrections: range = range(0)) -> dict[str, Any]:
    memory = create_empty_memory()
    memory["facts"] = [_fact(i, "correction" if i in corrections else "context") for i in range(count)]
    return memory


def _prompt_ids(memory: dict[str, Any], config: MemoryConfig) -> list[str]:
    prompt = build_update_prompt(memory, CONVERSATION, config=config, now=NOW)
    assert prompt is not None
    block = re.search(r"<current_memory>\n(.*)\n</current_memory>", prompt[1]["content"], re.DOTALL)
    assert block is not None
    return [fact["id"] for fact in json.loads(block.group(1))["facts"]]


def test_a_scope_of_1000_facts_shows_update_prompt_max_facts_of_them() -> None:
    config = MemoryConfig()
    memory = _memory(1000, corrections=range(0, 1000, 20))  # 50 corrections, spread through time
    prompt = build_update_prompt(memory, CONVERSATION, config=config, now=NOW)
    assert prompt is not None
    text = prompt[1]["content"]
    ids = _prompt_ids(memory, config)
    assert len(ids) == len(set(ids)) == config.update_prompt_max_facts == 200
    assert ids == sorted(ids)  # document order
    assert set(ids) >= RELEVANT  # old, but about what the conversation is about
    corrections = [f"fact_{i:04d}" for i in range(0, 1000, 20)]
    assert set(corrections) <= set(ids)  # 50 corrections fit their quarter (50): all kept
    newest = {f"fact_{i:04d}" for i in range(950, 1000)}
    assert newest <= set(ids)
    assert "this memory holds 1000 facts; <current_memory> shows 200 of them" in text
    assert shown_fact_ids(memory, CONVERSATION, config) == frozenset(ids)


def test_corrections_beyond_their_quarter_keep_the_newest() -> None:
    config = MemoryConfig(update_prompt_max_facts=40)
    memory = _memory(1000, corrections=range(0, 1000, 10))  # 100 corrections, 10 places
    chosen = [memory["facts"][i]["id"] for i in select_prompt_facts(memory["facts"], "", config)]
    shown_corrections = [fid for fid in chosen if fid in {f"fact_{i:04d}" for i in range(0, 1000, 10)}]
    assert shown_corrections == [f"fact_{i:04d}" for i in range(900, 1000, 10)]
    # No term of the query matches: the rest is the newest facts, 40 in all.
    assert len(chosen) == 40 and chosen[-1] == "fact_0999"


def test_a_scope_within_the_limit_is_shown_whole_without_a_note() -> None:
    config = MemoryConfig()
    memory = _memory(200)
    prompt = build_update_prompt(memory, CONVERSATION, config=config, now=NOW)
    assert prompt is not None
    assert len(_prompt_ids(memory, config)) == 200
    assert "<current_memory> shows" not in prompt[1]["content"]
    assert shown_fact_ids(memory, CONVERSATION, config) is None


def test_the_prompt_stays_bounded_as_the_scope_grows() -> None:
    # Without the staleness review, whose share depends on how many facts are old at NOW.
    config = MemoryConfig(staleness_review_enabled=False)
    sizes = {}
    for count in (1000, 2000, 4000):
        prompt = build_update_prompt(_memory(count), CONVERSATION, config=config, now=NOW)
        assert prompt is not None
        sizes[count] = len(prompt[1]["content"])
    assert max(sizes.values()) < 1.05 * min(sizes.values())


def test_staleness_review_lists_only_shown_facts() -> None:
    config = MemoryConfig(update_prompt_max_facts=40)
    memory = _memory(1000)  # every fact is older than 90 days at NOW
    prompt = build_update_prompt(memory, CONVERSATION, config=config, now=NOW)
    assert prompt is not None
    section = prompt[1]["content"].split("<stale_facts>")[1].split("</stale_facts>")[0]
    listed = set(re.findall(r"fact_\d{4}", section))
    assert listed and listed <= set(_prompt_ids(memory, config))
    assert listed >= RELEVANT


def _update(**fields: Any) -> MemoryUpdate:
    update: dict[str, Any] = {
        "user": {},
        "history": {},
        "newFacts": [],
        "factsToRemove": [],
        "staleFactsToRemove": [],
        "factsToConsolidate": [],
    }
    update.update(fields)
    return update  # type: ignore[return-value]


def test_the_reply_cannot_remove_replace_or_merge_a_fact_it_was_not_shown() -> None:
    config = MemoryConfig(consolidation_enabled=True, consolidation_min_facts=3, max_facts=2000)
    memory = _memory(1000)
    shown = shown_fact_ids(memory, CONVERSATION, config)
    assert shown is not None
    hidden = sorted({fact["id"] for fact in memory["facts"]} - shown)
    visible = sorted(shown - RELEVANT)
    new_fact = {
        "content": "The user moved the cluster to Hetzner's Falkenstein site",
        "category": "context",
        "confidence": 0.9,
        "replaces": ["fact_0017", hidden[0]],
    }
    merge = {"content": "The user has many hobbies", "category": "context", "confidence": 0.9}
    update = _update(
        newFacts=[new_fact],
        factsToRemove=[visible[0], hidden[1]],
        staleFactsToRemove=[{"id": visible[1], "reason": "old"}, {"id": hidden[2], "reason": "old"}],
        factsToConsolidate=[
            {"sourceIds": [visible[2], hidden[3]], "consolidated": merge},
            {"sourceIds": [visible[3], visible[4]], "consolidated": merge},
        ],
    )
    applied = apply_updates(memory, update, thread_id="t", config=config, now=NOW, shown=shown)
    kept = {fact["id"] for fact in applied.memory["facts"]}
    assert set(hidden[:4]) <= kept  # named by the reply, never shown: left alone
    assert {"fact_0017", visible[0], visible[1], visible[3], visible[4]}.isdisjoint(kept)
    assert visible[2] in kept  # its merge named a hidden fact too, so it did not happen
    assert applied.removals[visible[1]]["reason"] == "stale"
    assert applied.removals[visible[3]]["reason"] == "consolidated"
    added = next(fact for fact in applied.memory["facts"] if "Falkenstein" in fact["content"])
    assert added["relations"] == [{"type": "supersedes", "target": "fact_0017"}]
    assert len(applied.memory["facts"]) == 1000 - 5 + 2  # 5 removed; the new fact and the merge added


def test_without_shown_every_stored_id_may_be_named() -> None:
    memory = _memory(1000)
    update = _update(factsToRemove=["fact_0001"])
    applied = apply_updates(memory, update, thread_id="t", config=MemoryConfig(max_facts=2000), now=NOW)
    assert "fact_0001" not in {fact["id"] for fact in applied.memory["facts"]}
