"""The memory-record keys and the DeerFlow adapters, on SQLite and PostgreSQL.

DeerFlow sees a fact with record fields exactly as it sees a plain fact, unless the deployment sets
``deerflow_record_fields``, and its saves (which never saw the keys) keep them in the store. The
DeerFlow modules are the stand-ins of ``tests/support/deerflow_standins.py``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from memstore.config import MemoryConfig, load_memory_config, set_memory_config
from memstore.integrations import deerflow
from memstore.integrations.deerflow import DeerMemStore, SeedStore
from memstore.record import RECORD_KEYS
from memstore.storage.sql import SqlMemoryStorage
from tests.support import deerflow_standins

deerflow_standins.install()

RECORD = {
    "type": "procedural",
    "importance": 0.9,
    "tags": ["db", "work"],
    "sourceKind": "explicit_user_input",
    "raw": "honestly, I only ever use PostgreSQL",
    "structured": {"database": "PostgreSQL"},
}


def _fact(fact_id: str, content: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": fact_id,
        "content": content,
        "category": "knowledge",
        "confidence": 0.9,
        "createdAt": "2026-01-01T00:00:00Z",
        "source": "thread-1",
        **fields,
    }


def _store(url: str, user: str, *facts: dict[str, Any], agent: str | None = None) -> None:
    """Facts saved through memstore itself (the extractor and fact APIs may set record fields)."""
    storage = SqlMemoryStorage(url)
    document = storage.load(agent, user_id=user)
    document["facts"] = list(facts)
    assert storage.save(document, agent, user_id=user)


def _stored(url: str, user: str, agent: str | None = None) -> dict[str, dict[str, Any]]:
    return {fact["id"]: fact for fact in SqlMemoryStorage(url).reload(agent, user_id=user)["facts"]}


def _record_of(fact: dict[str, Any]) -> dict[str, Any]:
    return {key: fact[key] for key in RECORD_KEYS if key in fact}


def _with_a_related_fact(url: str, user: str, agent: str | None = None) -> None:
    """alice's ``rec`` (every record field, related to ``other``), ``other`` and ``drop``."""
    relations = [{"type": "related_to", "target": "other"}]
    _store(
        url,
        user,
        _fact("rec", "Uses PostgreSQL", **RECORD, relations=relations),
        _fact("other", "Works on gateways"),
        _fact("drop", "Drinks coffee"),
        agent=agent,
    )


EXPECTED = RECORD | {"relations": [{"type": "related_to", "target": "other"}]}


# -- the seed adapter (memory.storage_class) ------------------------------------------------------


def test_seed_shows_a_fact_with_record_fields_byte_for_byte_as_a_plain_fact(sql_url: str) -> None:
    _with_a_related_fact(sql_url, "alice")
    _store(sql_url, "bob", _fact("rec", "Uses PostgreSQL"))
    assert _record_of(_stored(sql_url, "alice")["rec"]) == EXPECTED
    storage = SeedStore(database_url=sql_url)
    alice = storage.load(user_id="alice")
    plain = storage.load(user_id="bob")["facts"][0]
    shown = next(fact for fact in alice["facts"] if fact["id"] == "rec")
    assert json.dumps(shown) == json.dumps(plain)
    assert not any(f'"{key}"' in json.dumps(alice) for key in RECORD_KEYS)
    assert json.dumps(storage.reload(user_id="alice")["facts"]) == json.dumps(alice["facts"])


@pytest.mark.parametrize("copy_kind", ["deepcopy", "dict"])
def test_seed_saves_keep_the_hidden_record_fields(sql_url: str, copy_kind: str) -> None:
    """DeerFlow's updater deep-copies the document, its fact endpoints shallow-copy it."""
    _with_a_related_fact(sql_url, "alice")
    storage = SeedStore(database_url=sql_url)
    loaded = storage.load(user_id="alice")
    document = copy.deepcopy(loaded) if copy_kind == "deepcopy" else dict(loaded)
    document["facts"] = [fact for fact in loaded["facts"] if fact["id"] != "drop"]
    document["facts"].append(_fact("new", "Likes tea", source="manual"))
    assert storage.save(document, user_id="alice") is True
    stored = _stored(sql_url, "alice")
    assert set(stored) == {"rec", "other", "new"}
    assert _record_of(stored["rec"]) == EXPECTED
    assert _record_of(stored["new"]) == {} and _record_of(stored["other"]) == {}
    assert not any(key in document["facts"][0] for key in RECORD_KEYS)  # the caller's dict is not changed


def test_seed_keeps_them_when_deerflow_edits_the_fact_it_loaded(sql_url: str) -> None:
    _with_a_related_fact(sql_url, "alice")
    storage = SeedStore(database_url=sql_url)
    loaded = copy.deepcopy(storage.load(user_id="alice"))
    for fact in loaded["facts"]:
        if fact["id"] == "rec":
            fact["content"] = "Uses PostgreSQL 17"
    assert storage.save(loaded, user_id="alice")
    rec = _stored(sql_url, "alice")["rec"]
    assert rec["content"] == "Uses PostgreSQL 17" and _record_of(rec) == EXPECTED


def test_a_seed_document_without_a_token_keeps_them_for_unchanged_facts(sql_url: str) -> None:
    """An import replaces the scope: the record fields of a fact it brings back unchanged stay."""
    _with_a_related_fact(sql_url, "alice")
    storage = SeedStore(database_url=sql_url)
    imported = json.loads(json.dumps(storage.load(user_id="alice")))  # no token: a file DeerFlow imports
    imported["facts"] = [fact for fact in imported["facts"] if fact["id"] != "drop"]
    assert storage.save(imported, user_id="alice")
    assert _record_of(_stored(sql_url, "alice")["rec"]) == EXPECTED
    rewritten = json.loads(json.dumps(storage.load(user_id="alice")))
    for fact in rewritten["facts"]:
        if fact["id"] == "rec":
            fact["content"] = "Used MySQL once"  # another fact under the same id: nothing to restore
    assert storage.save(rewritten, user_id="alice")
    rec = _stored(sql_url, "alice")["rec"]
    assert rec["content"] == "Used MySQL once" and _record_of(rec) == {}


def test_seed_with_the_setting_on_passes_the_record_fields_through(
    sql_url: str, isolated_config: MemoryConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_a_related_fact(sql_url, "alice")
    monkeypatch.setenv("MEMSTORE_DEERFLOW_RECORD_FIELDS", "true")
    monkeypatch.setenv("MEMSTORE_DATA_DIR", isolated_config.data_dir)
    set_memory_config(load_memory_config())
    storage = SeedStore(database_url=sql_url)
    loaded = storage.load(user_id="alice")
    rec = next(fact for fact in loaded["facts"] if fact["id"] == "rec")
    assert _record_of(rec) == EXPECTED
    document = copy.deepcopy(loaded)
    for fact in document["facts"]:
        if fact["id"] == "rec":
            fact["importance"] = 0.3
            del fact["raw"]
    assert storage.save(document, user_id="alice")
    assert _record_of(_stored(sql_url, "alice")["rec"]) == {
        k: v for k, v in EXPECTED.items() if k != "raw"
    } | {"importance": 0.3}
    assert (
        _record_of(SeedStore(database_url=sql_url, record_fields=False).load(user_id="alice")["facts"][0])
        == {}
    )


# -- the DeerMem adapter (memory.backend_config.storage_class) ----------------------------------


def _deermem(url: str, record_fields: bool | None = None) -> DeerMemStore:
    storage = deerflow.DeerMemStorage(None, database_url=url, record_fields=record_fields)
    assert isinstance(storage, DeerMemStore)
    return storage


def _unscoped(fact: dict[str, Any]) -> dict[str, Any]:
    return fact | {"scope": None}


@pytest.mark.parametrize("agent", [None, "coder"])
def test_deermem_shows_a_fact_with_record_fields_as_a_plain_fact(sql_url: str, agent: str | None) -> None:
    _with_a_related_fact(sql_url, "alice", agent)
    _store(sql_url, "bob", _fact("rec", "Uses PostgreSQL"), agent=agent)
    storage = _deermem(sql_url)
    bucket = agent or "__default__"
    document = storage.load(bucket, user_id="alice")
    plain = storage.load(bucket, user_id="bob")["facts"][0]
    shown = next(fact for fact in document["facts"] if fact["id"] == "rec")
    assert json.dumps(_unscoped(shown)) == json.dumps(_unscoped(plain))
    assert not any(key in fact for fact in document["facts"] for key in RECORD_KEYS)
    got = storage.get_fact("rec", user_id="alice", agent_name=bucket)
    assert got is not None and _unscoped(got) == _unscoped(shown)
    found = storage.search_facts("postgresql", scopes=[{"userId": "alice", "agentName": bucket}])
    assert [result["fact"]["id"] for result in found] == ["rec"]
    assert _unscoped(found[0]["fact"]) == _unscoped(shown)


def test_deermem_save_keeps_the_hidden_record_fields_and_the_revision(sql_url: str) -> None:
    _with_a_related_fact(sql_url, "alice", "coder")
    storage = _deermem(sql_url)
    loaded = storage.load("coder", user_id="alice")
    facts = [fact for fact in loaded["facts"] if fact["id"] != "drop"]
    facts.append(_fact("new", "Likes tea"))
    assert storage.save({"facts": facts}, "coder", user_id="alice")
    stored = _stored(sql_url, "alice", "coder")
    assert set(stored) == {"rec", "other", "new"}
    assert _record_of(stored["rec"]) == EXPECTED
    assert stored["rec"]["revision"] == 1  # unchanged for DeerMem: hiding is not a change
    reloaded = storage.load("coder", user_id="alice")
    assert [fact["revision"] for fact in reloaded["facts"] if fact["id"] == "rec"] == [1]


def test_deermem_change_sets_keep_them_and_answer_without_them(sql_url: str) -> None:
    _with_a_related_fact(sql_url, "alice")
    storage = _deermem(sql_url)
    loaded = storage.get_fact("rec", user_id="alice", agent_name="__default__")
    assert loaded is not None
    edited = loaded | {"content": "Uses PostgreSQL 17"}
    result = storage.apply_changes(
        {
            "upserts": [edited, _fact("new", "Likes tea")],
            "upsertRevisions": {"rec": 1, "new": None},
            "deletes": ["drop"],
        },
        user_id="alice",
        agent_name="__default__",
    )
    assert result["deletedFactIds"] == ["drop"]
    assert not any(key in fact for fact in result["upsertedFacts"] for key in RECORD_KEYS)
    stored = _stored(sql_url, "alice")
    assert set(stored) == {"rec", "other", "new"}
    assert stored["rec"]["content"] == "Uses PostgreSQL 17" and stored["rec"]["revision"] == 2
    assert _record_of(stored["rec"]) == EXPECTED
    unchanged = storage.apply_changes(
        {"upserts": [storage.get_fact("other", user_id="alice", agent_name="__default__")]},
        user_id="alice",
        agent_name="__default__",
    )
    assert unchanged["upsertedFacts"] == []  # restored and equal: no write, no revision


def test_deermem_with_the_setting_on_passes_the_record_fields_through(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    _with_a_related_fact(sql_url, "alice", "coder")
    set_memory_config(isolated_config.model_copy(update={"deerflow_record_fields": True}))
    storage = _deermem(sql_url)
    rec = next(fact for fact in storage.load("coder", user_id="alice")["facts"] if fact["id"] == "rec")
    assert _record_of(rec) == EXPECTED
    found = storage.search_facts("postgresql", scopes=[{"userId": "alice", "agentName": "coder"}])
    assert _record_of(found[0]["fact"]) == EXPECTED
    assert _record_of(_deermem(sql_url, record_fields=False).load("coder", user_id="alice")["facts"][0]) == {}
