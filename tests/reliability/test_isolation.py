"""Scope isolation under random operation sequences, and hostile ids, on every provider.

Every fact's content names the scope it was written to, so a read that returns another
scope's data is caught at once; a model of what each scope should hold catches lost or
leaked writes. Ids go through the public helpers, so the checks cover the whole path.
External identities go through ``make_safe_user_id``, which must never map two of them to one
scope, whatever the attacker picks as their name.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from memstore.cli.serve_app import create_app, header_user
from memstore.config import FILE_STORAGE_CLASS
from memstore.document import create_empty_memory
from memstore.errors import InvalidScopeError
from memstore.ops.facts import (
    clear_memory_data,
    create_memory_fact_with_created_fact,
    delete_memory_fact,
    get_memory_data,
    search_memory_facts,
)
from memstore.queries import FactFilter, search_facts
from memstore.scope import USER_ID_PATTERN, make_safe_user_id
from memstore.storage.file import FileMemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.records import SEARCH_MODES, SearchMode
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from tests.reliability.conftest import Record, configure
from tests.support.openai_server import OpenAIStubServer

EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
USERS = [None, "alice", "bob", "Alice"]
AGENTS = [None, "coder", "Coder-2"]
SCOPES = list(itertools.product(USERS, AGENTS))
_run = itertools.count()

operation = st.tuples(
    st.sampled_from(["add", "add", "add", "delete", "clear", "search"]),
    st.integers(0, len(SCOPES) - 1),
    st.integers(0, len(SCOPES) - 1),
)
SQL_SHAPED = [
    "x'; DROP TABLE memory_facts;--",
    "alice' OR '1'='1",
    'bob"; DELETE FROM memory_scopes; --',
    "%",
    "_%_",
    "u\x00",
    "ünïcødé",
    "用户",
    "a" * 129,
    "",
    " alice",
    "alice\n",
]
TRAVERSAL = [
    "..",
    "../alice",
    "../../etc/passwd",
    "a/b",
    "a\\b",
    "/abs",
    ".",
    "~root",
    "alice/../bob",
    "%2e%2e",
]


@pytest.fixture(
    params=[
        pytest.param("file", id="file"),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgresql", marks=pytest.mark.postgres),
    ]
)
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "file":
        configure(storage_class=FILE_STORAGE_CLASS, data_dir=str(tmp_path / "files"), max_facts=500)
    else:
        url = str(request.getfixturevalue(f"{request.param}_url"))
        configure(database_url=url, max_facts=500)
    yield request.param


def tag(run: int, scope: tuple[str | None, str | None]) -> str:
    user, agent = scope
    return f"r{run} {user}/{(agent or '-').lower()}"


Key = tuple[str | None, str | None]


class ScopeModel:
    """One example's scopes, fresh names per run, and what each of them should hold."""

    def __init__(self) -> None:
        self.run = next(_run)
        self.scopes = [(None if u is None else f"r{self.run}{u}", a) for u, a in SCOPES]
        for user, agent in self.scopes:
            if user is None:
                clear_memory_data(agent, user_id=None)  # global scopes are shared between examples
        self.facts: dict[Key, dict[str, str]] = {}

    def scope(self, target: int) -> tuple[str | None, str | None, Key]:
        user, agent = self.scopes[target]
        return user, agent, (user, agent.lower() if agent else None)

    def write(self, kind: str, target: int, content: str) -> None:
        """Apply an add, delete or clear through the public helpers, and to the model."""
        user, agent, key = self.scope(target)
        facts = self.facts.setdefault(key, {})
        if kind == "add":
            content = f"{tag(self.run, key)} {content}"
            _, created = create_memory_fact_with_created_fact(content, "context", 0.9, agent, user_id=user)
            facts[str(created["id"])] = content
        elif kind == "delete" and facts:
            fact_id = sorted(facts)[0]
            delete_memory_fact(fact_id, agent, user_id=user)
            del facts[fact_id]
        elif kind == "clear":
            clear_memory_data(agent, user_id=user)
            facts.clear()

    def contents(self, key: Key) -> set[str]:
        return set(self.facts.get(key, {}).values())


def test_random_operations_never_show_one_scope_another_scopes_data(provider: str, record: Record) -> None:
    counts = {"examples": 0, "operations": 0}

    @EXAMPLES
    @given(st.lists(operation, min_size=1, max_size=25))
    def run(ops: list[tuple[str, int, int]]) -> None:
        model = ScopeModel()
        for step, (kind, target, probe) in enumerate(ops):
            model.write(kind, target, f"n{step}")
            if kind == "search":
                user, agent, key = model.scope(target)
                found = search_memory_facts(f"r{model.run} ", agent_name=agent, user_id=user, limit=100)
                assert {f["content"] for f in found} == model.contents(key)
            probe_user, probe_agent, probe_key = model.scope(probe)
            contents = {f["content"] for f in get_memory_data(probe_agent, user_id=probe_user)["facts"]}
            assert all(c.startswith(tag(model.run, probe_key) + " ") for c in contents), (
                f"leak into {probe_key}"
            )
            assert contents == model.contents(probe_key)
        counts["examples"] += 1
        counts["operations"] += len(ops)

    run()
    record(provider=provider, scopes=len(SCOPES), **counts, leaks=0)


semantic_operation: st.SearchStrategy[tuple[str, SearchMode, int]] = st.tuples(
    st.sampled_from(["add", "add", "add", "delete", "clear", "search", "across"]),
    st.sampled_from(SEARCH_MODES[1:]),
    st.integers(0, len(SCOPES) - 1),
)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_semantic_and_hybrid_search_never_return_another_scopes_fact(
    backend: str, request: pytest.FixtureRequest, openai_server: OpenAIStubServer, record: Record
) -> None:
    """The same model check with embeddings on: every fact of a run shares its words with every other
    (so each is a near neighbour of all the others), and search by meaning must still stay in scope."""
    url = str(request.getfixturevalue(f"{backend}_url"))
    configure(
        database_url=url,
        max_facts=500,
        embedding_model="m",
        embedding_base_url=openai_server.base_url,
        embedding_provider="openai",
        dedup_similarity=1.0,  # every fact stays: the model below counts them all
    )
    counts = {"examples": 0, "searches": 0}

    @EXAMPLES
    @given(st.lists(semantic_operation, min_size=1, max_size=20))
    def run(ops: list[tuple[str, SearchMode, int]]) -> None:
        model = ScopeModel()
        for step, (kind, mode, target) in enumerate(ops):
            model.write(kind, target, f"n{step} shared words about green tea")
            user, agent, key = model.scope(target)
            if kind == "search":
                found = search_memory_facts("green tea", agent_name=agent, user_id=user, limit=100, mode=mode)
                assert {f["content"] for f in found} == model.contents(key), f"{mode} in {key}"
                counts["searches"] += 1
            elif kind == "across" and user is not None:
                page = search_facts(
                    "green tea", FactFilter(user_id=user, agent_name=key[1]), mode=mode, limit=100
                )
                assert {(f.user_id, f.agent_name) for f in page.facts} <= {key}, f"{mode} leak into {key}"
                assert {f.content for f in page.facts} == model.contents(key)
                counts["searches"] += 1
        counts["examples"] += 1

    run()
    record(provider=backend, **counts, leaks=0)


@EXAMPLES
@given(st.sampled_from(SQL_SHAPED) | st.text(max_size=20))
def test_hostile_user_ids_are_stored_literally_or_rejected_clearly(
    provider: str, tmp_path: Path, user_id: str
) -> None:
    storage = get_memory_storage()
    document = create_empty_memory()
    document["facts"] = [
        {"id": "fact_00000001", "content": f"owned by {user_id!r}", "category": "context", "confidence": 0.9}
    ]
    if not USER_ID_PATTERN.fullmatch(user_id):
        with pytest.raises(InvalidScopeError, match="Invalid user_id"):
            storage.save(document, user_id=user_id)
        with pytest.raises(InvalidScopeError, match="Invalid user_id"):
            storage.load(user_id=user_id)
        return
    assert storage.save(document, user_id=user_id)
    assert [f["content"] for f in storage.load(user_id=user_id)["facts"]] == [f"owned by {user_id!r}"]
    if isinstance(storage, SqlMemoryStorage):
        with get_engine(storage._url).connect() as conn:
            stored = conn.execute(
                text("SELECT user_id FROM memory_scopes WHERE user_id = :u"), {"u": user_id}
            )
            assert [row[0] for row in stored] == [user_id]


@pytest.mark.parametrize("bad", TRAVERSAL)
@pytest.mark.parametrize("part", ["user_id", "agent_name"])
def test_path_traversal_ids_are_rejected_by_the_file_provider(tmp_path: Path, bad: str, part: str) -> None:
    storage = FileMemoryStorage(tmp_path / "store")
    scope: dict[str, Any] = {"user_id": "alice", "agent_name": None, part: bad}
    with pytest.raises(InvalidScopeError):
        storage.save(create_empty_memory(), scope["agent_name"], user_id=scope["user_id"])
    with pytest.raises(InvalidScopeError):
        storage.load(scope["agent_name"], user_id=scope["user_id"])
    assert list(tmp_path.rglob("*")) == []


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user=st.text(max_size=12), agent=st.none() | st.text(max_size=12))
def test_every_accepted_file_scope_stays_inside_the_data_directory(
    tmp_path: Path, user: str, agent: str | None
) -> None:
    storage = FileMemoryStorage(tmp_path / "store")
    try:
        path = storage.path_for(agent, user_id=user)
    except InvalidScopeError:
        return
    assert path.resolve().is_relative_to((tmp_path / "store").resolve())


CAROL = "carol@example.com"
CAROL_ID = "carol-example-com-e0d47ca1bc1eb62e"  # make_safe_user_id(CAROL), before and after the fix
raw_ids = (
    st.text(max_size=140)
    | st.from_regex(r"[A-Za-z0-9_-]{1,128}", fullmatch=True)
    | st.from_regex(r"[a-z.@-]{0,30}-[0-9a-fA-F]{15,17}", fullmatch=True)
    | st.sampled_from(
        [CAROL, CAROL_ID, CAROL_ID.upper(), CAROL_ID + "0", "", "-", "a" * 100, "a" * 128, "default"]
    )
)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.lists(raw_ids, min_size=2, max_size=6, unique=True))
def test_make_safe_user_id_never_maps_two_raw_ids_to_one(raws: list[str]) -> None:
    # The adversarial case: an attacker whose raw name is exactly what another raw id maps to.
    candidates = set(raws) | {make_safe_user_id(raw) for raw in raws}
    mapped = {raw: make_safe_user_id(raw) for raw in candidates}
    assert len(set(mapped.values())) == len(candidates), mapped
    assert all(USER_ID_PATTERN.fullmatch(user_id) for user_id in mapped.values())


def test_a_proxy_name_equal_to_an_encoded_id_reads_nothing_of_its_owner(provider: str) -> None:
    """``serve --user-header``: carol's mapped id, sent as another user's name, is another scope."""
    assert make_safe_user_id(CAROL) == CAROL_ID
    app = create_app(header_user("X-User"), allowed_hosts=["testserver"], max_body_bytes=1 << 20)
    with TestClient(app) as client:
        carol, impostor = {"X-User": CAROL}, {"X-User": CAROL_ID}
        created = client.post("/api/memory/facts", json={"content": "Carol's secret"}, headers=carol)
        assert created.status_code == 200, created.text
        fact_id = created.json()["facts"][0]["id"]

        assert client.get("/api/memory", headers=impostor).json()["facts"] == []
        assert client.get("/api/memory/facts", params={"q": "secret"}, headers=impostor).json() == []
        assert client.delete(f"/api/memory/facts/{fact_id}", headers=impostor).status_code == 404
        assert client.delete("/api/memory", headers=impostor).status_code == 200
        assert [f["content"] for f in client.get("/api/memory", headers=carol).json()["facts"]] == [
            "Carol's secret"
        ]
    assert [f["content"] for f in get_memory_data(user_id=CAROL_ID)["facts"]] == ["Carol's secret"]
