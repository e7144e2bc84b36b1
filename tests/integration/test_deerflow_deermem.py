"""Contract of the DeerMem adapter (``memory.backend_config.storage_class``) on SQLite and PostgreSQL.

DeerMem's ABC and conflict exceptions come from ``tests/support/deerflow_standins.py`` (signatures
and names only); the change sets below have the shape DeerMem's updater sends.
"""

from __future__ import annotations

import copy
import logging
import re
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from memstore.config import MemoryConfig
from memstore.errors import RevisionConflictError, StorageSetupError, StorageUnavailableError
from memstore.integrations import deerflow
from memstore.integrations.deerflow import DeerMemStore, SeedStore
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


def test_an_agent_save_without_facts_is_refused_and_keeps_them(sql_url: str) -> None:
    """Issue 30, item 1: DeerMem refuses an agent save that carries no ``facts``."""
    storage = _storage(sql_url)
    assert storage.save({"facts": [_fact("keep me")]}, "agent-a", user_id="u")
    revision = storage.reload("agent-a", user_id="u")["revision"]
    assert (
        storage.save({"user": {}, "history": {}}, "agent-a", user_id="u", expected_revision=revision) is False
    )
    assert _contents(storage.reload("agent-a", user_id="u")) == {"keep me"}
    # A summaries save updates the sections it carries and keeps the others, as DeerMem does.
    assert storage.save(_summaries("Builds gateways") | {"history": {}}, user_id="u")
    history = {"recentMonths": {"summary": "Shipped v1", "updatedAt": ""}}
    assert storage.save({"history": history}, user_id="u")
    document = storage.reload(user_id="u")
    assert document["user"]["workContext"]["summary"] == "Builds gateways"
    assert document["history"]["recentMonths"]["summary"] == "Shipped v1"


def test_stale_summaries_sent_with_a_named_agents_facts_are_refused(sql_url: str) -> None:
    """Issue 30, item 2: the shape DeerMem's updater sends; a named agent's revision counts the
    user scope too, so summaries newer than the document's are not overwritten."""
    storage = _storage(sql_url)
    stale = storage.load("agent-a", user_id="alice")
    assert storage.save(
        storage.load(user_id="alice") | _summaries("newer"), user_id="alice", expected_revision=0
    )
    with pytest.raises(deerflow_standins.MemoryManifestRevisionConflict):
        storage.apply_changes(
            {"upserts": [_fact("not committed")], "upsertRevisions": {}, "summaries": _summaries("stale")},
            user_id="alice",
            agent_name="agent-a",
            expected_manifest_revision=stale["revision"],
        )
    assert storage.load(user_id="alice")["user"]["workContext"]["summary"] == "newer"
    assert storage.load("agent-a", user_id="alice")["facts"] == []
    # Reloaded (DeerMem's retry), the same change lands, and the count moves with both scopes.
    fresh = storage.reload("agent-a", user_id="alice")
    result = storage.apply_changes(
        {"upserts": [_fact("committed")], "upsertRevisions": {}, "summaries": _summaries("merged")},
        user_id="alice",
        agent_name="agent-a",
        expected_manifest_revision=fresh["revision"],
    )
    assert result["revision"] == fresh["revision"] + 2 == storage.load("agent-a", user_id="alice")["revision"]
    assert storage.load(user_id="alice")["user"]["workContext"]["summary"] == "merged"
    # Another agent's writes do not count: memstore merges across agents (documented).
    storage.apply_changes({"upserts": [_fact("b")]}, user_id="alice", agent_name="agent-b")
    assert storage.load("agent-a", user_id="alice")["revision"] == result["revision"]


def test_an_upsert_without_a_revision_is_a_create(sql_url: str) -> None:
    """Issue 30, item 3: no revision in ``upsertRevisions`` or on the fact means "must not exist yet"."""
    storage = _storage(sql_url)
    storage.apply_changes({"upserts": [{"id": "x", "content": "first"}]}, user_id="u", agent_name="agent-a")
    with pytest.raises(deerflow_standins.MemoryFactRevisionConflict, match="must not already exist"):
        storage.apply_changes(
            {"upserts": [{"id": "x", "content": "second"}]}, user_id="u", agent_name="agent-a"
        )
    with pytest.raises(deerflow_standins.MemoryFactRevisionConflict, match="found None"):
        storage.apply_changes(
            {"upserts": [{"id": "y", "content": "edit of nothing", "revision": 1}]},
            user_id="u",
            agent_name="agent-a",
        )
    with pytest.raises(ValueError, match="upsertRevisions"):
        storage.apply_changes(
            {"upserts": [{"id": "x", "content": "bad"}], "upsertRevisions": {"x": 0}},
            user_id="u",
            agent_name="agent-a",
        )
    assert _contents(storage.load("agent-a", user_id="u")) == {"first"}
    # With the stored revision, on the fact as DeerMem hands it back, it is an edit.
    [stored] = storage.load("agent-a", user_id="u")["facts"]
    result = storage.apply_changes(
        {"upserts": [stored | {"content": "second"}]}, user_id="u", agent_name="agent-a"
    )
    assert [fact["revision"] for fact in result["upsertedFacts"]] == [2]
    assert _contents(storage.load("agent-a", user_id="u")) == {"second"}


def test_strict_user_scope_refuses_every_call_without_a_user(sql_url: str) -> None:
    """Issue 30, item 4: DeerMem's ``strict_user_scope`` raises ``ValueError`` for a call with no user."""
    storage = deerflow.DeerMemStorage(StrictConfig(), database_url=sql_url)
    with pytest.raises(ValueError, match="strict_user_scope"):
        storage.load()
    with pytest.raises(ValueError, match="strict_user_scope"):
        storage.apply_changes({"upserts": [_fact("x")]}, agent_name="agent-a")
    with pytest.raises(ValueError, match="strict_user_scope"):
        storage.search_facts("x", scopes=[{"userId": None, "agentName": "agent-a"}])
    storage.apply_changes({"upserts": [_fact("Alice's")]}, user_id="alice", agent_name="agent-a")
    assert _contents(storage.load("agent-a", user_id="alice")) == {"Alice's"}
    # Without the setting, no user is DeerMem's legacy global scope, as before.
    assert _storage(sql_url).load()["facts"] == []


@dataclass
class StrictConfig:
    max_facts: int = 100
    strict_user_scope: bool = True


def test_a_missing_sqlite_database_is_a_setup_error(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 30, item 6: a SQLite file that is not there (and may not be created) will not appear on
    a retry: a setup error naming the fix, not "unreachable"."""
    missing = f"sqlite:///file:{tmp_path / 'absent.db'}?mode=rw&uri=true"
    folder = f"sqlite:///{tmp_path}"  # a folder where the file should be
    for url in (missing, folder):
        with pytest.raises(StorageSetupError, match=r"no SQLite database there.*memstore db upgrade"):
            DeerMemStore(None, database_url=url).load(user_id="alice")
    assert not (tmp_path / "absent.db").exists()
    assert "unreachable" not in caplog.text


def test_an_outage_is_logged_on_memstores_logger(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 30, item 6: DeerFlow logs the error its own way; memstore's operators read memstore's logger."""
    down = f"postgresql+psycopg://memstore@127.0.0.1:{_closed_port()}/memstore"
    caplog.set_level(logging.ERROR, logger="memstore.integrations.deerflow")
    for storage in (DeerMemStore(None, database_url=down), SeedStore(database_url=down)):
        caplog.clear()
        with pytest.raises(StorageUnavailableError):
            storage.load(user_id="alice@example.com")
        [record] = [r for r in caplog.records if r.name == "memstore.integrations.deerflow"]
        assert "database unreachable" in record.getMessage() and "load" in record.getMessage()
        assert "alice" not in record.getMessage()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_documented_deermem_config_builds_no_retrieval_index() -> None:
    """Issue 30, item 6: DeerMem builds its own FTS5 index unless ``retrieval_adapter`` is empty;
    memstore's adapter searches itself, so the snippet turns DeerMem's off."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text(encoding="utf-8")
    [snippet] = [
        block for block in re.findall(r"```yaml\n(.*?)```", page, re.DOTALL) if "DeerMemStorage" in block
    ]
    backend = yaml.safe_load(snippet)["memory"]["backend_config"]
    assert backend == {
        "storage_class": "memstore.integrations.deerflow.DeerMemStorage",
        "retrieval_adapter": "",
    }


def test_usage_counts_an_access_recorded_a_moment_ago(sql_url: str) -> None:
    """DeerMem reads usage right before it evicts: a pending access must count (DeerFlow's own
    test_query_search_records_access_but_default_injection_does_not)."""
    storage = _storage(sql_url)
    fact = _fact("Prefers concise answers")
    storage.apply_changes({"upserts": [fact]}, user_id="u1", agent_name="__default__")
    storage.record_fact_accesses([fact["id"]], agent_name="__default__", user_id="u1")
    usage = storage.get_fact_usage(agent_name="__default__", user_id="u1")
    assert usage[fact["id"]]["accessCount"] == 1 and usage[fact["id"]]["accessHeat"] == 1.0


@pytest.mark.parametrize(
    ("field", "value"),
    [("topics", "python"), ("revision", []), ("content", " "), ("confidence", 2), ("status", "deleted")],
)
def test_a_fact_outside_deermems_schema_is_refused(sql_url: str, field: str, value: object) -> None:
    """DeerMem's storage refuses a malformed DeerMem fact, naming the field; so does the adapter."""
    storage = _storage(sql_url)
    bad = _fact("Project uses Python") | {field: value}
    with pytest.raises(ValueError, match=field):
        storage.apply_changes(
            {"upserts": [bad], "upsertRevisions": {bad["id"]: None}}, user_id="u", agent_name="a"
        )
    assert storage.save({"facts": [bad]}, "a", user_id="u") is False
    assert storage.load("a", user_id="u")["facts"] == []
