"""Contract of the DeerMem adapter (``memory.backend_config.storage_class``) on SQLite and PostgreSQL.

DeerMem's ABC and conflict exceptions come from ``tests/support/deerflow_standins.py`` (signatures
and names only); the change sets below have the shape DeerMem's updater sends.
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import text

from memstore.config import MemoryConfig
from memstore.errors import RevisionConflictError
from memstore.integrations import deerflow
from memstore.integrations.deerflow import DeerMemStore
from memstore.scope import DEFAULT_USER_ID, make_safe_user_id
from memstore.storage.records import FactFilter
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from tests.support import deerflow_standins
from tests.support.openai_server import OpenAIStubServer

deerflow_standins.install()


@dataclass
class Config:
    """The one ``DeerMemConfig`` field the adapter reads."""

    max_facts: int = 100


def _storage(url: str, max_facts: int = 100) -> DeerMemStore:
    storage = deerflow.DeerMemStorage(Config(max_facts), database_url=url)
    assert isinstance(storage, DeerMemStore)
    return storage


def _fact(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"fact_{uuid.uuid4().hex[:8]}",
        "content": content,
        "category": "knowledge",
        "confidence": 0.9,
        "source": {"type": "conversation", "threadId": "thread-1"},
        **extra,
    }


def _summaries(text: str) -> dict[str, Any]:
    return {"user": {"workContext": {"summary": text, "updatedAt": "2026-01-01T00:00:00Z"}}}


def _contents(document: dict[str, Any]) -> set[str]:
    return {fact["content"] for fact in document["facts"]}


def test_deermem_builds_a_subclass_of_its_abc_from_its_config() -> None:
    cls: type = deerflow.DeerMemStorage
    assert issubclass(cls, DeerMemStore)
    assert issubclass(cls, deerflow_standins.DeerMemMemoryStorage)
    assert issubclass(cls.manifest_conflict, deerflow_standins.MemoryManifestRevisionConflict)
    assert issubclass(cls.fact_conflict, deerflow_standins.MemoryFactRevisionConflict)


def test_round_trip_with_per_user_summaries_and_per_agent_facts(sql_url: str) -> None:
    storage = _storage(sql_url)
    summaries = storage.load(user_id="alice") | _summaries("Builds gateways")
    assert storage.save(summaries, user_id="alice", expected_revision=0)
    tagged = _fact("Uses PostgreSQL", topics=["db"])
    assert storage.save({"facts": [tagged]}, "__default__", user_id="alice")
    assert storage.save({"facts": [_fact("Writes Rust")]}, "coder", user_id="alice")
    default = storage.load("__default__", user_id="alice")
    coder = storage.load("coder", user_id="alice")
    assert (
        default["user"]["workContext"]["summary"]
        == coder["user"]["workContext"]["summary"]
        == "Builds gateways"
    )
    assert _contents(default) == {"Uses PostgreSQL"} and _contents(coder) == {"Writes Rust"}
    fact = default["facts"][0]
    assert fact["source"] == tagged["source"] and fact["topics"] == ["db"] and fact["revision"] == 1
    assert fact["scope"] == {"userId": "alice", "agentName": "__default__"}
    assert storage.load(user_id="alice")["facts"] == []
    # The default bucket is the user's own memstore scope: what `memstore show --user alice` reads.
    assert {f["content"] for f in SqlMemoryStorage(sql_url).load(user_id="alice")["facts"]} == {
        "Uses PostgreSQL"
    }


def test_users_are_isolated_and_arguments_are_not_mutated(sql_url: str) -> None:
    storage = _storage(sql_url)
    change_set = {"upserts": [_fact("Alice only")], "upsertRevisions": {}}
    before = copy.deepcopy(change_set)
    storage.apply_changes(change_set, user_id="alice", agent_name="__default__")
    assert change_set == before
    document = {"facts": [_fact("Bob only")]}
    kept = copy.deepcopy(document)
    assert storage.save(document, "__default__", user_id="b" * 140)
    assert document == kept
    assert _contents(storage.load("__default__", user_id="alice")) == {"Alice only"}
    assert _contents(storage.load("__default__", user_id="b" * 140)) == {"Bob only"}


def test_deerflows_fallback_user_is_memstores_fallback_user(sql_url: str) -> None:
    """As in the seed adapter: DeerFlow's ``default`` (nobody signed in) is memstore's fallback scope."""
    storage = _storage(sql_url)
    storage.apply_changes(
        {"upserts": [_fact("Single-user install")]}, user_id="default", agent_name="__default__"
    )
    sql = SqlMemoryStorage(sql_url)
    assert _contents(sql.load(user_id=DEFAULT_USER_ID)) == {"Single-user install"}
    assert sql.load(user_id=make_safe_user_id("default"))["facts"] == []
    assert _contents(storage.load("__default__", user_id="default")) == {"Single-user install"}


def test_a_stale_expected_revision_raises_deermems_conflict(sql_url: str) -> None:
    storage = _storage(sql_url)
    loaded = storage.load("__default__", user_id="alice")
    assert storage.save({"facts": [_fact("First")]}, "__default__", user_id="alice", expected_revision=0)
    with pytest.raises(deerflow_standins.MemoryManifestRevisionConflict) as raised:
        storage.save(
            {"facts": [_fact("Second")]}, "__default__", user_id="alice", expected_revision=loaded["revision"]
        )
    assert isinstance(raised.value, RevisionConflictError)
    with pytest.raises(deerflow_standins.MemoryManifestRevisionConflict):
        storage.apply_changes({"summaries": _summaries("x")}, user_id="alice", expected_manifest_revision=0)
    assert _contents(storage.load("__default__", user_id="alice")) == {"First"}


def test_two_stale_writers_without_expected_revision_merge(sql_url: str) -> None:
    first, second = _storage(sql_url), _storage(sql_url)
    assert first.save({"facts": [_fact("Base")]}, "coder", user_id="alice")
    a, b = first.load("coder", user_id="alice"), second.load("coder", user_id="alice")
    a["facts"].append(_fact("From A"))
    b["facts"].append(_fact("From B"))
    assert first.save(a, "coder", user_id="alice")
    assert second.save(b, "coder", user_id="alice")
    assert _contents(first.reload("coder", user_id="alice")) == {"Base", "From A", "From B"}


def test_apply_changes_is_one_revision_of_row_changes_with_fact_revisions(sql_url: str) -> None:
    storage = _storage(sql_url)
    keep, drop = _fact("Keep"), _fact("Drop")
    result = storage.apply_changes(
        {"upserts": [keep, drop], "upsertRevisions": {keep["id"]: None, drop["id"]: None}},
        user_id="alice",
        agent_name="__default__",
        expected_manifest_revision=0,
    )
    assert result["complete"] is False and result["revision"] == 1 and result["deletedFactIds"] == []
    edited = keep | {"content": "Keep, edited"}
    result = storage.apply_changes(
        {
            "upserts": [edited],
            "upsertRevisions": {keep["id"]: 1},
            "deletes": [drop["id"]],
            "deleteRevisions": {drop["id"]: 1},
            "summaries": _summaries("Edited together"),
        },
        user_id="alice",
        agent_name="__default__",
        expected_manifest_revision=1,
    )
    assert result["revision"] == 2  # facts and summaries of the default bucket: one transaction
    assert result["deletedFactIds"] == [drop["id"]]
    assert [fact["revision"] for fact in result["upsertedFacts"]] == [2]
    document = storage.load("__default__", user_id="alice")
    assert _contents(document) == {"Keep, edited"}
    assert document["user"]["workContext"]["summary"] == "Edited together"
    with pytest.raises(deerflow_standins.MemoryFactRevisionConflict):
        storage.apply_changes(
            {"upserts": [edited | {"content": "stale"}], "upsertRevisions": {keep["id"]: 1}},
            user_id="alice",
            agent_name="__default__",
        )
    with pytest.raises(deerflow_standins.MemoryFactRevisionConflict):
        storage.apply_changes(
            {"upserts": [_fact("dup") | {"id": keep["id"]}], "upsertRevisions": {keep["id"]: None}},
            user_id="alice",
            agent_name="__default__",
        )
    assert _contents(storage.load("__default__", user_id="alice")) == {"Keep, edited"}


def test_summaries_sent_with_a_named_agents_facts_land_on_the_user(sql_url: str) -> None:
    storage = _storage(sql_url)
    storage.apply_changes(
        {"upserts": [_fact("Agent fact")], "summaries": _summaries("Shared")},
        user_id="alice",
        agent_name="coder",
        expected_manifest_revision=0,
    )
    assert storage.load(user_id="alice")["user"]["workContext"]["summary"] == "Shared"
    assert _contents(storage.load("coder", user_id="alice")) == {"Agent fact"}


def test_clear_all_empties_every_bucket_and_the_summaries(sql_url: str) -> None:
    storage = _storage(sql_url)
    storage.apply_changes(
        {"upserts": [_fact("d")], "summaries": _summaries("s")}, user_id="alice", agent_name="__default__"
    )
    storage.apply_changes({"upserts": [_fact("c")]}, user_id="alice", agent_name="coder")
    storage.apply_changes({"upserts": [_fact("bob")]}, user_id="bob", agent_name="coder")
    cleared = storage.clear_all(user_id="alice")
    assert cleared["facts"] == [] and cleared["user"]["workContext"]["summary"] == ""
    assert storage.load("coder", user_id="alice")["facts"] == []
    assert _contents(storage.load("coder", user_id="bob")) == {"bob"}


@dataclass
class Evicted:
    """DeerMem's ``EvictedFact``: the fields its ``record_capacity_eviction`` hands over."""

    fact_id: str
    category: str
    score: float
    components: dict[str, float]


@dataclass
class Decision:
    """DeerMem's ``FactEvictionDecision`` (the fields the adapter reads)."""

    evicted: list[Evicted]
    policy: str = "hybrid-v1"


def test_the_cap_is_deermems_max_facts_and_the_hooks_reach_memstore(sql_url: str) -> None:
    storage = _storage(sql_url, max_facts=10)
    facts = [_fact(f"fact {n}", confidence=0.5 + n / 100) for n in range(12)]
    assert storage.save({"facts": facts}, "__default__", user_id="alice")
    assert len(storage.load("__default__", user_id="alice")["facts"]) == 10
    assert storage.get_fact_usage(agent_name="__default__", user_id="alice") == {}
    used = facts[5]["id"]
    storage.record_fact_accesses([used, used], agent_name="__default__", user_id="alice")
    sql = SqlMemoryStorage(sql_url)
    assert storage._sql.get().flush_access() == 1
    usage = storage.get_fact_usage(agent_name="__default__", user_id="alice")
    assert list(usage) == [used] and usage[used]["accessHeat"] == 2.0 and usage[used]["lastAccessedAt"]
    assert storage.get_fact_usage(agent_name="__default__", user_id="bob") == {}

    # DeerMem trims itself, saves, then reports why: the deletion's audit row learns it.
    document = storage.load("__default__", user_id="alice")
    gone = document["facts"][-1]["id"]
    document["facts"] = document["facts"][:-1]
    assert storage.save(document, "__default__", user_id="alice")
    decision = Decision([Evicted(gone, "knowledge", 0.41, {"confidence": 0.6, "accessHeat": float("nan")})])
    storage.record_capacity_eviction(decision, max_facts=10, agent_name="__default__", user_id="alice")
    [entry] = [
        entry
        for entry in sql.history(FactFilter(user_id="alice", agent_name=None), fact_id=gone, limit=10)
        if entry.action == "delete"
    ]
    assert entry.detail == {
        "reason": "evicted",
        "policy": "hybrid-v1",
        "max_facts": 10,
        "score": 0.41,
        "confidence": 0.6,
        "accessHeat": None,  # JSON has no NaN
    }
    # memstore's own eviction reasons are never overwritten.
    document = storage.load("__default__", user_id="alice")
    document["facts"] += [_fact("strong one", confidence=0.99), _fact("strong two", confidence=0.98)]
    assert storage.save(document, "__default__", user_id="alice")
    alice = FactFilter(user_id="alice", agent_name=None)
    [capped] = [
        entry
        for entry in sql.history(alice, fact_id=None, limit=100)
        if entry.action == "delete" and entry.entity_id != gone
    ]
    assert capped.detail is not None and capped.detail["policy"] == "hybrid"
    storage.record_capacity_eviction(
        Decision([Evicted(capped.entity_id, "knowledge", 0.0, {})]),
        max_facts=10,
        agent_name="__default__",
        user_id="alice",
    )
    [again] = [
        entry for entry in sql.history(alice, fact_id=capped.entity_id, limit=10) if entry.action == "delete"
    ]
    assert again.detail == capped.detail
    storage.clear_fact_metadata(agent_name="__default__", user_id="alice")
    assert len(storage.load("__default__", user_id="alice")["facts"]) == 10
    storage.close()
    sql.close()


def _embedding_storage(url: str, config: MemoryConfig, server: OpenAIStubServer) -> DeerMemStore:
    """DeerMem over memstore with embeddings from the local test server."""
    config.embedding_model = "m"
    config.embedding_base_url = server.base_url
    config.embedding_provider = "openai"
    return _storage(url)


def test_search_facts_ranks_each_scope_by_meaning_and_never_crosses_users(
    sql_url: str, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    """DeerMem's memory_search calls ``search_facts``: memstore's hybrid ranking, scope by scope."""
    storage = _embedding_storage(sql_url, isolated_config, openai_server)
    tea, rust = _fact("Drinks green tea every morning"), _fact("Writes Rust at work", category="context")
    assert storage.save({"facts": [tea, rust]}, "__default__", user_id="alice")
    assert storage.save({"facts": [_fact("Drinks green tea every morning")]}, "__default__", user_id="bob")
    alice: list[dict[str, str | None]] = [{"userId": "alice", "agentName": "__default__"}]
    found = storage.search_facts("green tea", scopes=alice, top_k=5, mode="hybrid")
    assert [result["fact"]["id"] for result in found][:1] == [tea["id"]]
    assert {result["fact"]["scope"]["userId"] for result in found} == {"alice"}
    assert all(result["matchType"] == "hybrid" for result in found)
    # DeerMem saved these facts without embedding them: the first search embedded and kept them.
    with get_engine(sql_url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM memory_fact_embeddings")).scalar_one() == 2
    only_context = storage.search_facts("green tea", scopes=alice, filters={"category": "context"})
    assert [result["fact"]["id"] for result in only_context] == [rust["id"]]
    assert storage.search_facts("  ", scopes=alice) == []
    assert len(storage.search_facts("green tea", scopes=alice, top_k=1)) == 1


def test_search_facts_without_embeddings_ranks_by_words(sql_url: str) -> None:
    storage = _storage(sql_url)
    tea, rust = _fact("Drinks green tea every morning"), _fact("Writes Rust at work")
    assert storage.save({"facts": [tea, rust]}, "coder", user_id="alice")
    coder: list[dict[str, str | None]] = [{"userId": "alice", "agentName": "coder"}]
    found = storage.search_facts("which tea?", scopes=coder)
    assert [(result["fact"]["id"], result["matchType"]) for result in found] == [(tea["id"], "fulltext")]


def test_a_mixed_case_agents_vectors_are_kept_and_reused(
    sql_url: str, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    """memstore stores agent names lower-cased; DeerMem's ``Coder`` must still find its scope's vectors."""
    storage = _embedding_storage(sql_url, isolated_config, openai_server)
    assert storage.save(
        {"facts": [_fact("Drinks green tea"), _fact("Writes Rust")]}, "Coder", user_id="alice"
    )
    coder: list[dict[str, str | None]] = [{"userId": "alice", "agentName": "Coder"}]
    assert storage.search_facts("green tea", scopes=coder, mode="semantic")
    with get_engine(sql_url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM memory_fact_embeddings")).scalar_one() == 2
    before = len(openai_server.embedding_requests)
    assert storage.search_facts("rust", scopes=coder, mode="semantic")
    assert (
        len(openai_server.embedding_requests) == before + 1
    )  # the query only: the facts' vectors are reused
