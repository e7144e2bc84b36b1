"""A scope well past 500 facts on the SQL provider (issue 39): saved, read, injected, evicted and
updated by the LLM, on SQLite and PostgreSQL; and the file provider's refusal of such a cap.

Embeddings come from the local test server (``embedding_vectors.term_vector``: texts sharing words
are close), so which fact a query should bring into the block can be read off the words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from memstore.config import FILE_STORAGE_CLASS, MemoryConfig, build_memory_config
from memstore.document import create_empty_memory, format_timestamp
from memstore.errors import ConfigError
from memstore.gateway.middleware import MemoryMiddleware
from memstore.ops.embeddings import embed_facts
from memstore.queries import FactFilter, memory_history
from memstore.storage.file import FileMemoryStorage
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from memstore.update.updater import MemoryUpdater
from tests.support.openai_server import OpenAIStubServer
from tests.support.semantic import MODEL

SIZE = 2000
USER = "alice"
START = datetime(2026, 1, 1, tzinfo=UTC)
TOPICS = ("gardening", "chess", "cycling", "pottery", "sailing", "baking", "astronomy", "knitting")
BEES = "fact_0123"
"""The one fact about bees: old and doubtful, so only relevance to the query can inject it."""
WEAKEST = "fact_0007"


def _fact(i: int) -> dict[str, Any]:
    fact_id = f"fact_{i:04d}"
    content = f"The user enjoys {TOPICS[i % len(TOPICS)]} with friends, note {i}"
    confidence = 0.8
    if fact_id == BEES:
        content, confidence = "The user keeps bees on a rooftop in Lisbon", 0.5
    if fact_id == WEAKEST:
        confidence = 0.3
    return {
        "id": fact_id,
        "content": content,
        "category": "context",
        "confidence": confidence,
        "createdAt": format_timestamp(START + timedelta(hours=i)),
    }


def _document() -> dict[str, Any]:
    document = create_empty_memory()
    document["facts"] = [_fact(i) for i in range(SIZE)]
    return document


@pytest.fixture
def large(
    sql_url: str, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> Iterator[SqlMemoryStorage]:
    """The process-wide SQL provider with ``max_facts`` 2000, embeddings and the LLM from the test server."""
    isolated_config.database_url = sql_url
    isolated_config.max_facts = SIZE
    isolated_config.embedding_model = MODEL
    isolated_config.embedding_base_url = openai_server.base_url
    isolated_config.embedding_provider = "openai"
    isolated_config.llm_base_url = openai_server.base_url
    isolated_config.llm_api_key = SecretStr("test-key")
    isolated_config.model_name = "test-model"
    reset_memory_storage()
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    assert storage.save(_document(), user_id=USER)
    yield storage
    reset_memory_storage()


def test_2000_facts_are_read_back_injected_by_relevance_and_evicted_at_the_cap(
    large: SqlMemoryStorage,
) -> None:
    loaded = large.load(user_id=USER)
    assert [fact["id"] for fact in loaded["facts"]] == [f"fact_{i:04d}" for i in range(SIZE)]
    assert large.reload(user_id=USER)["facts"] == loaded["facts"]
    assert embed_facts(storage=large) == SIZE

    block = MemoryMiddleware().memory_context(user_id=USER, query="How are my bees on the Lisbon rooftop?")
    lines = [line for line in block.splitlines() if line.startswith("- [")]
    assert "keeps bees on a rooftop in Lisbon" in lines[0]  # the least confident but one, ranked first
    assert 10 < len(lines) < 200  # the token budget, not the scope, bounds the block

    document = large.load(user_id=USER)
    document["facts"].append({**_fact(SIZE), "confidence": 0.95})
    assert large.save(document, user_id=USER, origin="thread-9")
    live = {fact["id"] for fact in large.load(user_id=USER)["facts"]}
    assert len(live) == SIZE and f"fact_{SIZE:04d}" in live and WEAKEST not in live
    [deleted] = [e for e in memory_history(FactFilter(user_id=USER), fact_id=WEAKEST) if e.action == "delete"]
    assert deleted.origin == "thread-9" and deleted.detail is not None
    assert deleted.detail["reason"] == "evicted" and deleted.detail["max_facts"] == SIZE


def _prompt_fact_ids(prompt: str) -> list[str]:
    block = re.search(r"<current_memory>\n(.*)\n</current_memory>", prompt, re.DOTALL)
    assert block is not None
    return [fact["id"] for fact in json.loads(block.group(1))["facts"]]


def test_an_llm_update_of_2000_facts_acts_only_on_the_facts_its_prompt_showed(
    large: SqlMemoryStorage, openai_server: OpenAIStubServer
) -> None:
    conversation = [
        {"role": "user", "content": "The bees on my Lisbon rooftop swarmed, so I gave them away."},
        {"role": "assistant", "content": "Sorry to hear about the bees."},
    ]
    first: dict[str, Any] = {"user": {}, "history": {}, "newFacts": [], "factsToRemove": []}
    openai_server.script(json.dumps(first))  # a dry run, to learn which facts the prompt shows
    MemoryUpdater().update_memory(conversation, thread_id="t-0", user_id=USER)
    shown = _prompt_fact_ids(openai_server.prompts()[-1])
    assert len(shown) == 200 and BEES in shown
    assert "this memory holds 2000 facts; <current_memory> shows 200 of them" in openai_server.prompts()[-1]
    hidden = [f"fact_{i:04d}" for i in range(SIZE) if f"fact_{i:04d}" not in shown]
    visible = [fact_id for fact_id in shown if fact_id != BEES]

    reply: dict[str, Any] = {
        "user": {},
        "history": {},
        "newFacts": [
            {
                "content": "The user gave their bee colonies away after a swarm",
                "category": "context",
                "confidence": 0.9,
                "replaces": [BEES, hidden[0]],
            }
        ],
        "factsToRemove": [visible[0], hidden[1]],
        "staleFactsToRemove": [{"id": visible[1], "reason": "old"}, {"id": hidden[2], "reason": "old"}],
    }
    openai_server.script(json.dumps(reply))
    assert MemoryUpdater().update_memory(conversation, thread_id="t-1", user_id=USER)
    facts = {fact["id"]: fact for fact in large.load(user_id=USER)["facts"]}
    assert set(hidden[:3]) <= set(facts)  # named by the reply, never shown to it: kept
    assert {BEES, visible[0], visible[1]}.isdisjoint(facts)
    [added] = [fact for fact in facts.values() if "bee colonies" in fact["content"]]
    assert added["relations"] == [{"type": "supersedes", "target": BEES}]
    # 2000 - 3 removed + 1 added: under the cap, nothing evicted.
    assert len(facts) == SIZE - 2


def test_the_file_provider_refuses_max_facts_past_500(tmp_path: Path, isolated_config: MemoryConfig) -> None:
    isolated_config.max_facts = 500
    assert FileMemoryStorage(tmp_path / "files").load(user_id=USER)["facts"] == []
    isolated_config.max_facts = 501
    with pytest.raises(ConfigError, match=r"max_facts is 501.*file provider keeps at most 500") as raised:
        FileMemoryStorage(tmp_path / "files")
    assert "SqlMemoryStorage" in str(raised.value)  # and it says what to use instead

    # Named as the provider, the configuration itself refuses, at load and on assignment.
    with pytest.raises(ValidationError, match="max_facts 501 is over 500"):
        isolated_config.storage_class = FILE_STORAGE_CLASS
    with pytest.raises(ConfigError, match="max_facts 501 is over 500"):
        build_memory_config({"storage_class": FILE_STORAGE_CLASS, "max_facts": 501})
    isolated_config.max_facts = 500
    isolated_config.storage_class = FILE_STORAGE_CLASS
    with pytest.raises(ValidationError, match="max_facts 501 is over 500"):
        isolated_config.max_facts = 501
