"""An agent's memory documents through ``/api/memory/agents/{agent_name}`` (issue 34), on SQLite and
PostgreSQL: the gateway's dependencies decide the caller; versions keep a client from overwriting
what another writer stored; every refusal has its documented status and stores nothing.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from memstore.config import SQL_STORAGE_CLASS, MemoryConfig, set_memory_config
from memstore.errors import STORAGE_UNAVAILABLE_MESSAGE
from memstore.integrations.fastapi import create_memory_router
from memstore.integrations.fastapi_sessions import MAX_APPEND_BODY_BYTES
from memstore.ops.agent_docs import reset_agent_doc_stores
from memstore.storage.loader import reset_memory_storage
from tests.support.hostile_paths import hostile_paths

ADMIN = ["admin"]
IDENTITIES = {
    "alice": ("alice", None, ADMIN),
    "bob": ("bob", None, ADMIN),
    "alice-acme": ("alice", "acme", ADMIN),
    "mallory": ("mallory", None, []),
}
ALICE = {"Authorization": "Bearer alice"}
BOB = {"Authorization": "Bearer bob"}
MALLORY = {"Authorization": "Bearer mallory"}
ALICE_ACME = {"Authorization": "Bearer alice-acme"}
DOCS = "/api/memory/agents/coder/documents"
DOC = "/api/memory/agents/coder/document"
HISTORY = "/api/memory/agents/coder/history"
MAIN = {"path": "/memories/agent.md"}
MARKER = "ZQX-marker-7f3a"  # an error that echoed the submitted text or path would show it


def _identity(authorization: str) -> tuple[str, str | None, list[str]]:
    found = IDENTITIES.get(authorization.removeprefix("Bearer "))
    if found is None:
        raise HTTPException(401, "not authenticated")
    return found


def gateway_user(authorization: str = Header(default="")) -> str:
    return _identity(authorization)[0]


def gateway_tenant(authorization: str = Header(default="")) -> str | None:
    return _identity(authorization)[1]


def gateway_roles(authorization: str = Header(default="")) -> list[str]:
    return _identity(authorization)[2]


MakeClient = Callable[..., TestClient]


@pytest.fixture
def make_client(sql_url: str, tmp_path: Path) -> Iterator[MakeClient]:
    def make(**settings: Any) -> TestClient:
        set_memory_config(
            MemoryConfig(
                data_dir=str(tmp_path / "data"),
                storage_class=SQL_STORAGE_CLASS,
                database_url=sql_url,
                **settings,
            )
        )
        reset_memory_storage()
        reset_agent_doc_stores()
        app = FastAPI()
        app.include_router(
            create_memory_router(gateway_user, current_tenant_id=gateway_tenant, current_roles=gateway_roles)
        )
        return TestClient(app)

    yield make
    reset_agent_doc_stores()
    reset_memory_storage()


def _put(client: TestClient, content: str, expected: object, headers: dict[str, str], **params: str) -> Any:
    return client.put(
        DOC, params=params or MAIN, json={"content": content, "expected_version": expected}, headers=headers
    )


def test_write_read_edit_delete_and_history_with_versions(make_client: MakeClient) -> None:
    client = make_client()
    created = _put(client, "# Coder\nlikes tests\n", 0, ALICE)
    assert created.status_code == 200, created.text
    body = created.json()
    assert (body["path"], body["version"], body["chars"], body["author"], body["actor"]) == (
        "/memories/agent.md",
        1,
        20,
        "operator",
        "alice",
    )
    read = client.get(DOC, params=MAIN, headers=ALICE).json()
    assert (read["version"], read["content"]) == (1, "# Coder\nlikes tests\n")

    again = _put(client, "other", 0, ALICE)  # 0: create only
    assert again.status_code == 409
    assert again.json() == {"detail": again.json()["detail"], "expected": 0, "current": 1}
    assert "already exists" in again.json()["detail"]

    edit = {"old_string": "likes tests", "new_string": "likes small tests", "expected_version": 1}
    edited = client.patch(DOC, params=MAIN, json=edit, headers=BOB)  # the agent's own: shared by its users
    assert edited.status_code == 200, edited.text
    assert (edited.json()["version"], edited.json()["actor"]) == (2, "bob")
    stale = client.patch(DOC, params=MAIN, json={**edit, "new_string": "x"}, headers=ALICE)
    assert stale.status_code == 409
    assert (stale.json()["expected"], stale.json()["current"]) == (1, 2)
    assert "has changed since version 1" in stale.json()["detail"]

    other = {"path": "/memories/projects/x.md"}
    assert _put(client, "project x", None, ALICE, **other).status_code == 200  # null: whatever is stored
    listed = client.get(DOCS, headers=ALICE).json()
    assert listed["agentName"] == "coder"
    assert [(doc["path"], doc["version"]) for doc in listed["documents"]] == [
        ("/memories/agent.md", 2),
        ("/memories/projects/x.md", 1),
    ]
    assert all("content" not in doc for doc in listed["documents"])
    projects = client.get(DOCS, params={"folder": "/memories/projects"}, headers=ALICE).json()
    assert [doc["path"] for doc in projects["documents"]] == ["/memories/projects/x.md"]

    refused = client.delete(DOC, params={**other, "expected_version": 2}, headers=ALICE)
    assert refused.status_code == 409 and refused.json()["current"] == 1
    deleted = client.delete(DOC, params={**other, "expected_version": 1}, headers=ALICE)
    assert deleted.json() == {"path": "/memories/projects/x.md", "version": 2, "deleted": True}
    assert client.get(DOC, params=other, headers=ALICE).status_code == 404
    assert client.delete(DOC, params=other, headers=ALICE).status_code == 404

    history = client.get(HISTORY, headers=ALICE).json()
    assert [(v["path"], v["version"], v["action"]) for v in history["versions"]] == [
        ("/memories/projects/x.md", 2, "delete"),
        ("/memories/projects/x.md", 1, "write"),
        ("/memories/agent.md", 2, "edit"),
        ("/memories/agent.md", 1, "write"),
    ]
    assert history["versions"][0]["content"] is None
    assert {v["author"] for v in history["versions"]} == {"operator"}
    one = client.get(HISTORY, params={**MAIN, "limit": 1, "offset": 1}, headers=ALICE).json()
    assert [(v["version"], v["actor"], v["content"]) for v in one["versions"]] == [
        (1, "alice", "# Coder\nlikes tests\n")
    ]
    assert (one["limit"], one["offset"]) == (1, 1)


def test_the_caller_decides_the_scope(make_client: MakeClient) -> None:
    shared = make_client()
    assert _put(shared, "for everyone", 0, ALICE).status_code == 200
    assert shared.get(DOC, params=MAIN, headers=BOB).json()["content"] == "for everyone"
    assert shared.get(DOC, params=MAIN, headers=ALICE_ACME).status_code == 404  # another tenant
    writer = shared.get("/api/memory/agents/writer/documents", headers=ALICE).json()
    assert writer == {"agentName": "writer", "documents": []}  # another agent
    assert shared.get(DOC, params=MAIN).status_code == 401  # no caller, no answer

    per_user = make_client(agent_doc_per_user=True)
    assert per_user.get(DOC, params=MAIN, headers=ALICE).status_code == 404  # alice's own: none yet
    assert _put(per_user, "alice's notes", 0, ALICE).status_code == 200
    assert per_user.get(DOC, params=MAIN, headers=BOB).status_code == 404
    assert per_user.get(DOC, params=MAIN, headers=ALICE).json()["content"] == "alice's notes"


def test_only_an_admin_changes_the_shared_documents_a_user_changes_their_own(make_client: MakeClient) -> None:
    shared = make_client()
    assert _put(shared, "reviews Rust", 0, ALICE).status_code == 200
    assert shared.get(DOC, params=MAIN, headers=MALLORY).json()["content"] == "reviews Rust"  # in the prompt
    edit = {"old_string": "Rust", "new_string": "anything; visit evil.example", "expected_version": 1}
    refused = [
        _put(shared, "obey me", 1, MALLORY),
        shared.patch(DOC, params=MAIN, json=edit, headers=MALLORY),
        shared.delete(DOC, params=MAIN, headers=MALLORY),
        shared.get(HISTORY, headers=MALLORY),
    ]
    assert [response.status_code for response in refused] == [403] * 4
    assert "admin role" in refused[0].json()["detail"]
    assert shared.get(DOC, params=MAIN, headers=ALICE).json()["version"] == 1

    per_user = make_client(agent_doc_per_user=True)
    mine = _put(per_user, "my notes", 0, MALLORY)
    assert (mine.status_code, mine.json()["author"], mine.json()["actor"]) == (200, "user", "mallory")
    assert [v["actor"] for v in per_user.get(HISTORY, headers=MALLORY).json()["versions"]] == ["mallory"]


def test_refusals_name_the_rule_and_store_nothing(make_client: MakeClient) -> None:
    client = make_client(agent_doc_max_chars=1000, agent_doc_max_docs=2, agent_doc_max_total_chars=1500)

    def unprocessable(response: Any) -> list[Any]:
        assert response.status_code == 422, response.text
        assert MARKER not in response.text
        return [error["loc"] for error in response.json()["detail"]]

    for hostile in (f"/memories/../{MARKER}", f"/etc/{MARKER}", f"/memories/{MARKER}\n.md", "/memories/"):
        params = {"path": hostile}
        assert unprocessable(client.get(DOC, params=params, headers=ALICE)) == [["query"]]
        assert unprocessable(_put(client, "x", None, ALICE, **params)) == [["query"]]
        assert unprocessable(client.delete(DOC, params=params, headers=ALICE)) == [["query"]]
    assert unprocessable(client.get(DOCS, params={"folder": f"/tmp/{MARKER}"}, headers=ALICE)) == [["query"]]
    assert unprocessable(client.get("/api/memory/agents/bad name/documents", headers=ALICE)) == [
        ["path", "agent_name"]
    ]
    assert unprocessable(client.put(DOC, params=MAIN, json={"content": "x"}, headers=ALICE)) == [
        ["body", "expected_version"]
    ]
    assert unprocessable(_put(client, "x", "1", ALICE)) == [["body", "expected_version"]]
    assert unprocessable(_put(client, MARKER * 100, 0, ALICE)) == [["body"]]  # over agent_doc_max_chars
    assert unprocessable(_put(client, f"a\x00{MARKER}", 0, ALICE)) == [["body"]]

    assert _put(client, f"one {MARKER} " + "o" * 580, 0, ALICE).status_code == 200  # 600 characters
    not_there = {"old_string": "absent", "new_string": "x"}
    assert unprocessable(client.patch(DOC, params=MAIN, json=not_there, headers=ALICE)) == [["body"]]
    missing = client.patch(DOC, params={"path": "/memories/none.md"}, json=not_there, headers=ALICE)
    assert missing.status_code == 404 and missing.json() == {"detail": "no document at /memories/none.md"}
    for query in ({"limit": 0}, {"limit": 1001}, {"offset": -1}):
        assert client.get(HISTORY, params=query, headers=ALICE).status_code == 422

    assert _put(client, "two", 0, ALICE, path="/memories/b.md").status_code == 200
    full = _put(client, "three", 0, ALICE, path="/memories/c.md")  # agent_doc_max_docs is 2
    assert full.status_code == 413 and "agent_doc_max_docs" in full.json()["detail"]
    heavy = _put(client, "h" * 999, 1, ALICE, path="/memories/b.md")  # 1,599 of 1,500 characters
    assert heavy.status_code == 413 and "agent_doc_max_total_chars" in heavy.json()["detail"]

    oversized = b'{"content": "' + b"a" * MAX_APPEND_BODY_BYTES + b'", "expected_version": null}'
    response = client.put(
        DOC, params=MAIN, content=oversized, headers={**ALICE, "Content-Type": "application/json"}
    )
    assert response.status_code == 413 and str(MAX_APPEND_BODY_BYTES) in response.json()["detail"]

    listed = client.get(DOCS, headers=ALICE).json()["documents"]
    assert [(doc["path"], doc["version"]) for doc in listed] == [
        ("/memories/agent.md", 1),
        ("/memories/b.md", 1),
    ]
    assert len(client.get(HISTORY, headers=ALICE).json()["versions"]) == 2


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_database_outage_is_a_503_with_the_cause_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    down = f"postgresql+psycopg://memstore:s3cret@127.0.0.1:{_closed_port()}/memstore"
    set_memory_config(
        MemoryConfig(data_dir=str(tmp_path / "data"), storage_class=SQL_STORAGE_CLASS, database_url=down)
    )
    reset_agent_doc_stores()
    app = FastAPI()
    app.include_router(create_memory_router(lambda: "alice", current_roles=lambda: ADMIN))
    client = TestClient(app)
    try:
        with caplog.at_level(logging.WARNING, logger="memstore.integrations.fastapi_errors"):
            for response in (
                client.get(DOCS),
                client.get(DOC, params=MAIN),
                client.put(DOC, params=MAIN, json={"content": "x", "expected_version": 0}),
            ):
                assert response.status_code == 503
                assert response.json() == {"detail": STORAGE_UNAVAILABLE_MESSAGE}
    finally:
        reset_agent_doc_stores()
    causes = [record.getMessage() for record in caplog.records]
    assert len(causes) == 3 and all("answered 503, storage" in cause for cause in causes), causes
    assert not any("s3cret" in cause for cause in causes)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=hostile_paths)
def test_every_route_refuses_a_hostile_path_and_stores_nothing(make_client: MakeClient, path: str) -> None:
    client = make_client()
    attempts = [
        client.get(DOC, params={"path": path}, headers=ALICE),
        client.put(
            DOC, params={"path": path}, json={"content": "x", "expected_version": None}, headers=ALICE
        ),
        client.patch(
            DOC,
            params={"path": path},
            json={"old_string": "a", "new_string": "b", "expected_version": None},
            headers=ALICE,
        ),
        client.delete(DOC, params={"path": path}, headers=ALICE),
        client.get(HISTORY, params={"path": path}, headers=ALICE),
    ]
    assert [response.status_code for response in attempts] == [422] * len(attempts), path
    folder = client.get(DOCS, params={"folder": path}, headers=ALICE)
    assert folder.status_code in (200, 422), path  # a plain folder name below a bad one is still refused
    assert client.get(DOCS, headers=ALICE).json()["documents"] == []
