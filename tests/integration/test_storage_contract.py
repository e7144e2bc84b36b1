"""The contract every storage provider must honour, run against each provider in conftest."""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

import pytest

from memstore.document import create_empty_memory
from memstore.errors import InvalidScopeError
from memstore.storage.base import MemoryStorage
from memstore.storage.limits import MAX_NESTING, nests_deeper
from tests.integration.conftest import StorageFactory


def _fact(fact_id: str, content: str, **extra: Any) -> dict[str, Any]:
    fact = {
        "id": fact_id,
        "content": content,
        "category": "context",
        "confidence": 0.8,
        "createdAt": "2026-07-14T15:35:46.123456Z",
        "source": "thread-1",
    }
    fact.update(extra)
    return fact


def _doc(*facts: dict[str, Any], work: str = "") -> dict[str, Any]:
    doc = create_empty_memory()
    doc["facts"] = list(facts)
    doc["user"]["workContext"] = {"summary": work, "updatedAt": "2026-07-14T15:35:46Z" if work else ""}
    return doc


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without provider bookkeeping (timestamps of the save, revision counters)."""
    return {
        "user": doc["user"],
        "history": doc["history"],
        "facts": sorted(doc["facts"], key=lambda f: f["id"]),
    }


def test_unknown_scope_loads_empty(storage: MemoryStorage) -> None:
    doc = storage.load("nobody-agent", user_id="nobody")
    empty = create_empty_memory()
    assert doc["facts"] == []
    assert doc["user"] == empty["user"]
    assert doc["history"] == empty["history"]
    assert doc["version"] == "1.0"


def test_a_scope_with_nothing_stored_has_no_last_updated(storage: MemoryStorage) -> None:
    # Issue 14.5: "nothing stored" must not look like memory last updated just now.
    assert storage.load(user_id="nobody")["lastUpdated"] == ""
    assert storage.save(_doc(_fact("fact_00000001", "Somebody exists")), user_id="somebody")
    assert storage.load(user_id="somebody")["lastUpdated"].endswith("Z")


def test_round_trip_preserves_unicode_large_content_and_unknown_keys(storage: MemoryStorage) -> None:
    big = "长期记忆 " + "x" * 200_000
    facts = [
        _fact("fact_0000000a", "Prefers 中文 replies — “quoted” ✓"),
        _fact("fact_0000000b", big, category="knowledge"),
        _fact(
            "fact_0000000c", "Never deploy on Fridays", category="correction", sourceError="Deployed Friday"
        ),
        _fact(
            "fact_0000000d", "Has custom keys", consolidatedFrom=["fact_1", "fact_2"], topics={"a": [1, 2]}
        ),
    ]
    doc = _doc(*facts, work="Works on memstore ☃")
    assert storage.save(doc, user_id="alice") is True
    loaded = storage.load(user_id="alice")
    assert _comparable(loaded) == _comparable(doc)
    assert loaded["lastUpdated"].endswith("Z")


def test_scopes_are_isolated(storage: MemoryStorage) -> None:
    scopes: list[tuple[str | None, str | None]] = [
        (None, None),
        ("alice", None),
        ("alice", "coder"),
        (None, "coder"),
        ("bob", None),
        ("bob", "coder"),
    ]
    for index, (user, agent) in enumerate(scopes):
        doc = _doc(_fact(f"fact_{index:08x}", f"fact of {user}/{agent}"), work=f"{user}/{agent}")
        assert storage.save(doc, agent, user_id=user)
    for index, (user, agent) in enumerate(scopes):
        loaded = storage.load(agent, user_id=user)
        assert [f["content"] for f in loaded["facts"]] == [f"fact of {user}/{agent}"]
        assert loaded["user"]["workContext"]["summary"] == f"{user}/{agent}"
        assert loaded["facts"][0]["id"] == f"fact_{index:08x}"


def test_agent_names_are_case_insensitive(storage: MemoryStorage) -> None:
    assert storage.save(_doc(_fact("fact_00000001", "agent fact")), "Coder", user_id="alice")
    assert [f["content"] for f in storage.load("coder", user_id="alice")["facts"]] == ["agent fact"]


def test_save_does_not_mutate_argument(storage: MemoryStorage) -> None:
    doc = _doc(_fact("fact_00000001", "one"))
    doc["lastUpdated"] = "2000-01-01T00:00:00Z"
    snapshot = copy.deepcopy(doc)
    assert storage.save(doc, user_id="alice")
    assert doc == snapshot


def test_loaded_document_is_independent_of_the_cache(storage: MemoryStorage) -> None:
    assert storage.save(_doc(_fact("fact_00000001", "one")), user_id="alice")
    first = storage.load(user_id="alice")
    first["facts"].append(_fact("fact_00000002", "mutated by caller"))
    first["user"]["workContext"]["summary"] = "mutated"
    second = storage.load(user_id="alice")
    assert [f["content"] for f in second["facts"]] == ["one"]
    assert second["user"]["workContext"]["summary"] == ""


def test_failed_save_returns_false_and_keeps_previous_data(storage: MemoryStorage) -> None:
    assert storage.save(_doc(_fact("fact_00000001", "kept")), user_id="alice")
    before = storage.load(user_id="alice")
    bad = _doc(_fact("fact_00000002", "unserialisable", extra=object()))
    assert storage.save(bad, user_id="alice") is False
    assert _comparable(storage.load(user_id="alice")) == _comparable(before)
    assert _comparable(storage.reload(user_id="alice")) == _comparable(before)


def test_unencodable_text_fails_the_save_cleanly(storage: MemoryStorage) -> None:
    assert storage.save(_doc(_fact("fact_00000001", "kept")), user_id="alice")
    assert storage.save(_doc(_fact("fact_00000002", "lone surrogate \ud800")), user_id="alice") is False
    assert [f["content"] for f in storage.load(user_id="alice")["facts"]] == ["kept"]


def test_reload_sees_a_change_made_by_another_instance(storage_factory: StorageFactory) -> None:
    first, second = storage_factory(), storage_factory()
    assert first.save(_doc(_fact("fact_00000001", "v1")), user_id="alice")
    assert [f["content"] for f in second.load(user_id="alice")["facts"]] == ["v1"]
    assert first.save(_doc(_fact("fact_00000002", "v2")), user_id="alice")
    assert [f["content"] for f in second.reload(user_id="alice")["facts"]] == ["v2"]
    # The cheap cache check must notice the other writer too: no stale read.
    assert [f["content"] for f in second.load(user_id="alice")["facts"]] == ["v2"]


@pytest.mark.parametrize("user_id", ["../etc", "a/b", "", "x" * 129, "naïve", "a b"])
def test_invalid_user_ids_are_rejected(storage: MemoryStorage, user_id: str) -> None:
    with pytest.raises(InvalidScopeError, match="user_id"):
        storage.save(_doc(), user_id=user_id)
    with pytest.raises(InvalidScopeError, match="user_id"):
        storage.load(user_id=user_id)


@pytest.mark.parametrize("agent_name", ["../x", "a_b", "", "a.b"])
def test_invalid_agent_names_are_rejected(storage: MemoryStorage, agent_name: str) -> None:
    with pytest.raises(InvalidScopeError, match="agent_name"):
        storage.load(agent_name, user_id="alice")


def test_eight_threads_load_and_save_concurrently(storage: MemoryStorage) -> None:
    rounds = 15
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(index: int) -> None:
        user = f"user-{index}"
        try:
            barrier.wait()
            for round_no in range(rounds):
                doc = storage.load(user_id=user)
                assert [f["content"] for f in doc["facts"]] == [f"{user} round {round_no - 1}"] * (
                    round_no > 0
                )
                doc["facts"] = [_fact(f"fact_{index:04x}{round_no:04x}", f"{user} round {round_no}")]
                assert storage.save(doc, user_id=user)
                other = storage.load(user_id=f"user-{(index + 1) % 8}")
                assert all(f["content"].startswith(f"user-{(index + 1) % 8} ") for f in other["facts"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    for index in range(8):
        facts = storage.reload(user_id=f"user-{index}")["facts"]
        assert [f["content"] for f in facts] == [f"user-{index} round {rounds - 1}"]
    json.dumps(storage.load(user_id="user-0"))


def _nested(levels: int) -> Any:
    value: Any = "bottom"
    for _ in range(levels):
        value = {"k": value}
    return value


def test_json_nested_past_the_limit_is_refused_and_never_breaks_later_reads(storage: MemoryStorage) -> None:
    """A 300-deep unknown key once stored made every later API call for its user fail."""
    assert storage.save(_doc(_fact("fact_0000000a", "kept")), user_id="alice")
    deepest = _fact("fact_0000000b", "at the limit", extra=_nested(MAX_NESTING - 1))
    assert not nests_deeper(deepest, MAX_NESTING) and nests_deeper(deepest, MAX_NESTING - 1)

    too_deep_fact = _doc(_fact("fact_0000000a", "kept"), _fact("fact_0000000c", "deep", extra=_nested(300)))
    too_deep_section = _doc(_fact("fact_0000000a", "kept"))
    too_deep_section["user"]["workContext"]["extra"] = _nested(MAX_NESTING)
    for document in (too_deep_fact, too_deep_section):
        assert not storage.save(document, user_id="alice")
    stored = storage.reload(user_id="alice")
    assert [f["content"] for f in stored["facts"]] == ["kept"]
    json.dumps(stored)  # what every reader does with it

    assert storage.save(_doc(_fact("fact_0000000a", "kept"), deepest), user_id="alice")
    assert _comparable(storage.reload(user_id="alice"))["facts"][1] == deepest
