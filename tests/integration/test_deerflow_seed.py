"""Contract of the seed DeerFlow adapter (``memory.storage_class``) on SQLite and PostgreSQL.

DeerFlow itself is not installed in CI: its ABC comes from ``tests/support/deerflow_standins.py``
(signatures only), and the calls below are the ones DeerFlow's updater and router make.
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from memstore.errors import StorageSetupError
from memstore.integrations import deerflow
from memstore.integrations.deerflow import SeedStore
from memstore.scope import DEFAULT_USER_ID, make_safe_user_id
from memstore.storage.sql import SqlMemoryStorage
from tests.support import deerflow_standins

deerflow_standins.install()


def _empty() -> dict[str, Any]:
    """DeerFlow's ``create_empty_memory()`` shape."""
    section = {"summary": "", "updatedAt": ""}
    return {
        "version": "1.0",
        "lastUpdated": "2026-01-01T00:00:00Z",
        "user": {name: dict(section) for name in ("workContext", "personalContext", "topOfMind")},
        "history": {name: dict(section) for name in ("recentMonths", "earlierContext", "longTermBackground")},
        "facts": [],
    }


def _fact(content: str, source: str = "thread-1", **extra: Any) -> dict[str, Any]:
    return {
        "id": f"fact_{uuid.uuid4().hex[:8]}",
        "content": content,
        "category": "knowledge",
        "confidence": 0.9,
        "createdAt": "2026-01-01T00:00:00Z",
        "source": source,
        **extra,
    }


def _contents(document: dict[str, Any]) -> set[str]:
    return {fact["content"] for fact in document["facts"]}


def test_deerflow_finds_a_subclass_of_its_own_abc_and_builds_it_without_arguments() -> None:
    cls = deerflow.MemstoreStorage
    assert issubclass(cls, deerflow_standins.SeedMemoryStorage)
    assert isinstance(cls(), SeedStore)


def test_the_constructor_never_raises_and_first_use_names_the_setting() -> None:
    storage = SeedStore(database_url="nosuchdialect://nowhere/db")
    with pytest.raises(StorageSetupError, match=r"memory\.storage_class.*memstore db upgrade"):
        storage.load(user_id="alice")


@pytest.mark.postgres
def test_an_unmigrated_postgresql_fails_loudly_at_first_use(pg_url: str) -> None:
    storage = SeedStore(database_url=pg_url)
    with pytest.raises(StorageSetupError, match="memstore db upgrade"):
        storage.save(_empty() | {"facts": [_fact("x")]}, user_id="alice")


def test_round_trip_hides_memstore_bookkeeping(sql_url: str) -> None:
    storage = SeedStore(database_url=sql_url)
    document = _empty()
    document["user"]["workContext"] = {"summary": "Builds gateways", "updatedAt": "2026-01-01T00:00:00Z"}
    document["facts"] = [_fact("Uses PostgreSQL", custom={"kept": True})]
    assert storage.save(document, user_id="alice") is True
    loaded = storage.load(user_id="alice")
    assert loaded["user"]["workContext"]["summary"] == "Builds gateways"
    assert loaded["facts"][0]["custom"] == {"kept": True}
    assert "revision" not in loaded and "incarnation" not in loaded
    assert '"revision"' not in json.dumps(loaded)  # what DeerFlow puts in <current_memory>


def test_scopes_are_isolated_and_long_ids_are_accepted(sql_url: str) -> None:
    storage = SeedStore(database_url=sql_url)
    long_id = "u" * 140
    deerflow_email_id = make_safe_user_id("alice@example.com")
    for user, agent in ((long_id, None), (deerflow_email_id, None), (deerflow_email_id, "coder")):
        assert storage.save(_empty() | {"facts": [_fact(f"{user[:5]}/{agent}")]}, agent, user_id=user)
    assert _contents(storage.load(user_id=long_id)) == {"uuuuu/None"}
    assert _contents(storage.load("coder", user_id=deerflow_email_id)) == {"alice/coder"}
    sql = SqlMemoryStorage(sql_url)
    assert _contents(sql.load(user_id=make_safe_user_id(long_id))) == {"uuuuu/None"}
    # DeerFlow's id for alice@example.com is stored as it is: the scope memstore's own mapping
    # gives that email (tests/integration/test_deerflow_users.py has the rest of the rule).
    assert _contents(sql.load(user_id=deerflow_email_id)) == {"alice/None"}
    assert sql.load(user_id=make_safe_user_id(deerflow_email_id))["facts"] == []


def test_deerflows_fallback_user_is_memstores_fallback_user(sql_url: str) -> None:
    """DeerFlow acts for ``default`` when nobody is signed in: that memory stays in memstore's
    fallback scope, the one it has always been stored in, although ``make_safe_user_id`` keeps
    outside callers who claim the name out of it."""
    storage = SeedStore(database_url=sql_url)
    assert storage.save(_empty() | {"facts": [_fact("Single-user install")]}, user_id="default")
    sql = SqlMemoryStorage(sql_url)
    assert _contents(sql.load(user_id=DEFAULT_USER_ID)) == {"Single-user install"}
    assert sql.load(user_id=make_safe_user_id("default"))["facts"] == []
    assert _contents(storage.load(user_id="default")) == {"Single-user install"}


def test_save_does_not_mutate_the_callers_document(sql_url: str) -> None:
    storage = SeedStore(database_url=sql_url)
    document = storage.load(user_id="alice")
    document["facts"].append(_fact("Likes tea"))
    before = copy.deepcopy(document)
    assert storage.save(document, user_id="alice")
    assert document == before
    assert "revision" not in document


def test_two_stale_writers_merge_on_the_updater_and_the_router_paths(sql_url: str) -> None:
    first, second = SeedStore(database_url=sql_url), SeedStore(database_url=sql_url)
    assert first.save(_empty() | {"facts": [_fact("Base fact")]}, user_id="alice")
    updater_copy = copy.deepcopy(first.load(user_id="alice"))  # DeerFlow's updater deep-copies
    router_view = second.load(user_id="alice")
    router_copy = dict(router_view)  # DeerFlow's fact endpoints shallow-copy
    router_copy["facts"] = [*router_view["facts"], _fact("Router fact", source="manual")]
    updater_copy["facts"].append(_fact("Updater fact"))
    assert first.save(updater_copy, user_id="alice")
    assert second.save(router_copy, user_id="alice")
    assert _contents(first.reload(user_id="alice")) == {"Base fact", "Updater fact", "Router fact"}


def test_a_stale_writer_does_not_resurrect_a_deleted_fact(sql_url: str) -> None:
    storage = SeedStore(database_url=sql_url)
    assert storage.save(_empty() | {"facts": [_fact("Keep"), _fact("Drop")]}, user_id="alice")
    stale = copy.deepcopy(storage.load(user_id="alice"))
    current = storage.load(user_id="alice")
    deleted = dict(current)
    deleted["facts"] = [fact for fact in current["facts"] if fact["content"] != "Drop"]
    assert storage.save(deleted, user_id="alice")
    stale["facts"].append(_fact("New"))
    assert storage.save(stale, user_id="alice")
    assert _contents(storage.load(user_id="alice")) == {"Keep", "New"}


def test_clear_is_memstores_clear(sql_url: str) -> None:
    storage = SeedStore(database_url=sql_url)
    assert storage.save(_empty() | {"facts": [_fact(f"fact {n}") for n in range(20)]}, user_id="alice")
    stale = copy.deepcopy(storage.load(user_id="alice"))
    assert storage.save(_empty(), user_id="alice")  # DeerFlow's clear_memory_data
    assert storage.load(user_id="alice")["facts"] == []
    engine = create_engine(sql_url)
    with engine.connect() as conn:
        cleared = conn.execute(text("SELECT cleared_at FROM memory_scopes WHERE user_id = 'alice'")).scalar()
        origins = set(
            conn.execute(text("SELECT DISTINCT origin FROM memory_history WHERE action = 'delete'")).scalars()
        )
    engine.dispose()
    assert cleared is not None  # the erasure stamp DeerFlow's empty save never left
    assert origins == {"erase"}
    stale["facts"].append(_fact("Late"))
    assert storage.save(stale, user_id="alice") is False  # loaded before the clear
    assert storage.load(user_id="alice")["facts"] == []


def test_a_duplicate_manual_fact_is_not_reported_as_created(sql_url: str) -> None:
    storage = SeedStore(database_url=sql_url)
    assert storage.save(_empty() | {"facts": [_fact("Prefers dark mode", source="manual")]}, user_id="alice")
    current = storage.load(user_id="alice")
    updated = dict(current)
    updated["facts"] = [*current["facts"], _fact("  prefers DARK mode ", source="manual")]
    assert storage.save(updated, user_id="alice") is False
    assert len(storage.load(user_id="alice")["facts"]) == 1


def test_max_facts_comes_from_deerflows_memory_config(sql_url: str) -> None:
    deerflow_standins.seed_config.max_facts = 12
    try:
        storage = SeedStore(database_url=sql_url)
        facts = [_fact(f"fact {n}", confidence=0.5 + n / 100) for n in range(15)]
        assert storage.save(_empty() | {"facts": facts}, user_id="alice")
    finally:
        deerflow_standins.seed_config.max_facts = 100
    assert len(storage.load(user_id="alice")["facts"]) == 12
    assert len(SeedStore(database_url=sql_url, max_facts=10).load(user_id="alice")["facts"]) == 12
