"""Manual edits that race another writer report what the store kept, on SQLite and PostgreSQL.

The race is made deterministic: right before the edit's own save, another writer (a second
``SqlMemoryStorage`` on the same database, as another process or replica would be) saves its
change. The edit then merges against a newer revision, and the merge rules decide what stays:
a duplicate added first wins, a fact deleted first stays deleted, the first change to a fact
wins. The helpers, the tools and the HTTP API must say so instead of reporting success.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from memstore.config import SQL_STORAGE_CLASS, MemoryConfig, set_memory_config
from memstore.errors import DuplicateFactError, FactEditConflictError, FactNotFoundError
from memstore.gateway.tools import memory_add, memory_update
from memstore.integrations.fastapi import create_memory_router
from memstore.ops.facts import (
    create_memory_fact,
    create_memory_fact_with_created_fact,
    delete_memory_fact,
    update_memory_fact,
)
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage

OtherWrite = Callable[[SqlMemoryStorage], None]


@pytest.fixture
def url(sql_url: str, tmp_path: Path) -> Iterator[str]:
    set_memory_config(
        MemoryConfig(data_dir=str(tmp_path / "data"), storage_class=SQL_STORAGE_CLASS, database_url=sql_url)
    )
    reset_memory_storage()
    yield sql_url
    reset_memory_storage()


@pytest.fixture
def before_next_save(url: str, monkeypatch: pytest.MonkeyPatch) -> Callable[[OtherWrite], None]:
    """Arrange for ``write`` to run through another storage instance just before the next save."""

    def arrange(write: OtherWrite) -> None:
        storage = get_memory_storage()
        real_save = storage.save

        def save(*args: Any, **kwargs: Any) -> bool:
            monkeypatch.setattr(storage, "save", real_save)
            write(SqlMemoryStorage(url))
            return real_save(*args, **kwargs)

        monkeypatch.setattr(storage, "save", save)

    return arrange


def _add(content: str) -> OtherWrite:
    def write(other: SqlMemoryStorage) -> None:
        memory = other.load(user_id="alice")
        memory["facts"].append({"id": "fact_0000beef", "content": content, "confidence": 0.8})
        assert other.save(memory, user_id="alice")

    return write


def _delete(fact_id: str) -> OtherWrite:
    def write(other: SqlMemoryStorage) -> None:
        memory = other.load(user_id="alice")
        memory["facts"] = [fact for fact in memory["facts"] if fact["id"] != fact_id]
        assert other.save(memory, user_id="alice")

    return write


def _edit(fact_id: str, **fields: Any) -> OtherWrite:
    def write(other: SqlMemoryStorage) -> None:
        memory = other.load(user_id="alice")
        memory["facts"] = [dict(f, **fields) if f["id"] == fact_id else f for f in memory["facts"]]
        assert other.save(memory, user_id="alice")

    return write


def _stored() -> list[tuple[str, str]]:
    """The scope as a fresh storage instance reads it from the database."""
    return [(f["id"], f["content"]) for f in SqlMemoryStorage().load(user_id="alice")["facts"]]


def test_a_duplicate_added_first_elsewhere_is_a_duplicate_not_a_phantom_id(
    before_next_save: Callable[[OtherWrite], None],
) -> None:
    before_next_save(_add("Likes tea"))
    with pytest.raises(DuplicateFactError) as raised:
        create_memory_fact_with_created_fact("likes TEA", user_id="alice")
    assert raised.value.existing_id == "fact_0000beef"
    assert _stored() == [("fact_0000beef", "Likes tea")]

    before_next_save(_add("Likes coffee"))  # the tool: same race, error JSON instead of "added"
    assert json.loads(memory_add("LIKES COFFEE", user_id="alice")) == {"error": "Duplicate fact"}


def test_an_edit_of_a_fact_deleted_first_elsewhere_is_not_found(
    before_next_save: Callable[[OtherWrite], None],
) -> None:
    [fact] = create_memory_fact("Uses vim", user_id="alice")["facts"]
    before_next_save(_delete(fact["id"]))
    with pytest.raises(FactNotFoundError):
        update_memory_fact(fact["id"], content="Uses emacs", user_id="alice")
    assert _stored() == []

    [fact] = create_memory_fact("Uses nano", user_id="alice")["facts"]
    before_next_save(_delete(fact["id"]))
    assert json.loads(memory_update(fact["id"], confidence=0.9, user_id="alice")) == {
        "error": f"Fact not found: {fact['id']}"
    }


def test_an_edit_of_a_fact_changed_first_elsewhere_is_a_conflict(
    before_next_save: Callable[[OtherWrite], None],
) -> None:
    [fact] = create_memory_fact("Uses vim", user_id="alice")["facts"]
    before_next_save(_edit(fact["id"], content="Uses neovim"))
    with pytest.raises(FactEditConflictError):
        update_memory_fact(fact["id"], content="Uses emacs", user_id="alice")
    assert _stored() == [(fact["id"], "Uses neovim")]

    # Different fields make no difference: the first change to a fact wins as a whole.
    before_next_save(_edit(fact["id"], confidence=0.95))
    result = json.loads(memory_update(fact["id"], category="knowledge", user_id="alice"))
    assert "changed by another writer" in result["error"]
    [stored] = SqlMemoryStorage().load(user_id="alice")["facts"]
    assert (stored["category"], stored["confidence"]) == ("context", 0.95)


def test_an_edit_to_content_added_first_elsewhere_is_a_duplicate(
    before_next_save: Callable[[OtherWrite], None],
) -> None:
    [fact] = create_memory_fact("Uses vim", user_id="alice")["facts"]
    before_next_save(_add("Uses emacs"))
    with pytest.raises(DuplicateFactError) as raised:
        update_memory_fact(fact["id"], content="uses EMACS", user_id="alice")
    assert raised.value.existing_id == "fact_0000beef"
    assert sorted(_stored()) == sorted([(fact["id"], "Uses vim"), ("fact_0000beef", "Uses emacs")])


def test_edits_that_do_not_race_return_the_stored_document(
    before_next_save: Callable[[OtherWrite], None],
) -> None:
    [fact] = create_memory_fact("Uses vim", user_id="alice")["facts"]
    before_next_save(_add("Likes tea"))  # a concurrent, unrelated add merges with the edit
    memory = update_memory_fact(fact["id"], content="Uses emacs", user_id="alice")
    assert [(f["id"], f["content"]) for f in memory["facts"]] == _stored()
    assert sorted(_stored()) == sorted([(fact["id"], "Uses emacs"), ("fact_0000beef", "Likes tea")])
    assert delete_memory_fact(fact["id"], user_id="alice")["facts"][0]["content"] == "Likes tea"


def test_the_http_api_answers_409_and_404_for_edits_the_merge_dropped(
    before_next_save: Callable[[OtherWrite], None],
) -> None:
    app = FastAPI()
    app.include_router(create_memory_router(lambda: "alice"))
    with TestClient(app) as client:
        before_next_save(_add("Likes tea"))
        duplicate = client.post("/api/memory/facts", json={"content": "likes tea"})
        assert duplicate.status_code == 409, duplicate.text
        assert "fact_0000beef" in duplicate.json()["detail"]

        fact = client.post("/api/memory/facts", json={"content": "Uses vim"}).json()["facts"][-1]
        before_next_save(_edit(fact["id"], content="Uses neovim"))
        conflict = client.patch(f"/api/memory/facts/{fact['id']}", json={"content": "Uses emacs"})
        assert conflict.status_code == 409, conflict.text

        before_next_save(_delete(fact["id"]))
        gone = client.patch(f"/api/memory/facts/{fact['id']}", json={"confidence": 0.9})
        assert gone.status_code == 404, gone.text

        assert [f["content"] for f in client.get("/api/memory").json()["facts"]] == ["Likes tea"]
    assert _stored() == [("fact_0000beef", "Likes tea")]
