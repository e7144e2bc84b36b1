"""The ``/api/memory`` router through FastAPI's ``TestClient``, on SQLite and PostgreSQL.

The app is a small "gateway": bearer tokens map to users in its own dependency, which is the
only place the router learns who is calling.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from memstore.cli.serve_app import header_user
from memstore.config import SQL_STORAGE_CLASS, MemoryConfig, set_memory_config
from memstore.document import (
    MAX_CATEGORY_CHARS,
    MAX_DOCUMENT_DEPTH,
    MAX_DOCUMENT_FACTS,
    MAX_FACT_CHARS,
    MAX_SUMMARY_CHARS,
    create_empty_memory,
)
from memstore.gateway.tools import memory_add
from memstore.integrations.fastapi import create_memory_router
from memstore.ops.facts import get_memory_data
from memstore.scope import DEFAULT_USER_ID, make_safe_user_id
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines

TOKENS = {"token-alice": "alice", "token-bob": "bob", "token-bad": "../etc"}
ALICE = {"Authorization": "Bearer token-alice"}
BOB = {"Authorization": "Bearer token-bob"}


def gateway_user(authorization: str = Header(default="")) -> str:
    """The gateway's own authentication: the router never reads a client header itself."""
    user = TOKENS.get(authorization.removeprefix("Bearer "))
    if user is None:
        raise HTTPException(401, "not authenticated")
    return user


def build_client(
    database_url: str, tmp_path: Path, identity: Callable[..., str] = gateway_user
) -> TestClient:
    set_memory_config(
        MemoryConfig(
            data_dir=str(tmp_path / "data"), storage_class=SQL_STORAGE_CLASS, database_url=database_url
        )
    )
    reset_memory_storage()
    app = FastAPI()
    app.include_router(create_memory_router(identity))
    return TestClient(app)


@pytest.fixture
def client(sql_url: str, tmp_path: Path) -> Iterator[TestClient]:
    with build_client(sql_url, tmp_path) as test_client:
        yield test_client
    reset_memory_storage()


def add_fact(client: TestClient, content: str, headers: dict[str, str], **fields: Any) -> dict[str, Any]:
    response = client.post("/api/memory/facts", json={"content": content, **fields}, headers=headers)
    assert response.status_code == 200, response.text
    [fact] = [fact for fact in response.json()["facts"] if fact["content"] == content]
    return dict(fact)


def contents(client: TestClient, headers: dict[str, str]) -> list[str]:
    response = client.get("/api/memory", headers=headers)
    assert response.status_code == 200, response.text
    return [fact["content"] for fact in response.json()["facts"]]


def test_fact_lifecycle(client: TestClient) -> None:
    fact = add_fact(client, "Prefers Python", ALICE, category="preference", confidence=0.9)
    assert fact["source"] == "manual" and fact["confidence"] == 0.9
    assert "sourceError" not in fact  # None fields are left out, as in the reference
    add_fact(client, "Acme deploys Python services", ALICE)

    found = client.get("/api/memory/facts", params={"q": "python"}, headers=ALICE)
    assert found.status_code == 200
    assert sorted(f["content"] for f in found.json()) == ["Acme deploys Python services", "Prefers Python"]
    by_category = client.get(
        "/api/memory/facts", params={"q": "python", "category": "preference"}, headers=ALICE
    )
    assert [f["id"] for f in by_category.json()] == [fact["id"]]
    limited = client.get("/api/memory/facts", params={"q": "python", "limit": 1}, headers=ALICE)
    assert len(limited.json()) == 1

    patched = client.patch(f"/api/memory/facts/{fact['id']}", json={"content": "Prefers Rust"}, headers=ALICE)
    assert patched.status_code == 200
    [after] = [f for f in patched.json()["facts"] if f["id"] == fact["id"]]
    assert after["content"] == "Prefers Rust"
    assert (after["category"], after["confidence"], after["createdAt"]) == (
        "preference",
        0.9,
        fact["createdAt"],
    )

    deleted = client.delete(f"/api/memory/facts/{fact['id']}", headers=ALICE)
    assert deleted.status_code == 200
    assert contents(client, ALICE) == ["Acme deploys Python services"]


def test_errors_are_mapped(client: TestClient) -> None:
    fact = add_fact(client, "Likes tea", ALICE)
    other = add_fact(client, "Likes coffee", ALICE)

    duplicate = client.post("/api/memory/facts", json={"content": "  LIKES TEA "}, headers=ALICE)
    assert duplicate.status_code == 409
    assert fact["id"] in duplicate.json()["detail"]
    renamed = client.patch(f"/api/memory/facts/{other['id']}", json={"content": "likes tea"}, headers=ALICE)
    assert renamed.status_code == 409

    for body in ({"content": ""}, {"content": "x", "confidence": 1.5}, {}):
        assert client.post("/api/memory/facts", json=body, headers=ALICE).status_code == 422
    blank = client.post("/api/memory/facts", json={"content": "   "}, headers=ALICE)
    assert blank.status_code == 422
    assert blank.json()["detail"][0]["loc"] == ["body", "content"]
    assert (
        client.patch(f"/api/memory/facts/{fact['id']}", json={"confidence": -1}, headers=ALICE).status_code
        == 422
    )
    assert client.get("/api/memory/facts", params={"q": ""}, headers=ALICE).status_code == 422
    assert client.get("/api/memory/facts", params={"q": "x", "limit": 0}, headers=ALICE).status_code == 422

    missing = client.delete("/api/memory/facts/fact_missing0", headers=ALICE)
    assert missing.status_code == 404
    assert missing.json() == {"detail": "Memory fact 'fact_missing0' not found."}
    assert client.patch("/api/memory/facts/fact_missing0", json={}, headers=ALICE).status_code == 404

    assert sorted(contents(client, ALICE)) == ["Likes coffee", "Likes tea"]  # nothing changed


def test_identity_comes_only_from_the_gateway_dependency(client: TestClient) -> None:
    assert client.get("/api/memory").status_code == 401
    assert client.get("/api/memory/config").status_code == 401
    invalid = client.get("/api/memory", headers={"Authorization": "Bearer token-bad"})
    assert invalid.status_code == 422
    assert "Invalid user_id" in invalid.json()["detail"][0]["msg"]


def test_one_user_cannot_touch_another_users_facts(client: TestClient) -> None:
    secret = add_fact(client, "Alice's salary is 100k", ALICE)
    add_fact(client, "Bob likes chess", BOB)

    assert contents(client, BOB) == ["Bob likes chess"]
    assert client.get("/api/memory/facts", params={"q": "salary"}, headers=BOB).json() == []
    path = f"/api/memory/facts/{secret['id']}"
    assert client.patch(path, json={"content": "hacked"}, headers=BOB).status_code == 404
    assert client.delete(path, headers=BOB).status_code == 404
    assert client.delete("/api/memory", headers=BOB).status_code == 200

    assert contents(client, ALICE) == ["Alice's salary is 100k"]
    assert contents(client, BOB) == []


def test_a_header_identity_named_default_cannot_reach_the_fallback_scope(
    sql_url: str, tmp_path: Path
) -> None:
    """``default`` is the user of every call that names none (tool mode, the middleware without
    ``set_current_user``); behind ``memstore serve --user-header`` a caller who says it is
    ``default`` must not read or write that memory."""
    claims_default = {"X-Forwarded-User": "default"}
    with build_client(sql_url, tmp_path, header_user("X-Forwarded-User")) as client:
        memory_add("Fallback note about the salary")  # no user bound: the fallback scope
        [fallback] = get_memory_data(user_id=DEFAULT_USER_ID)["facts"]

        assert contents(client, claims_default) == []
        assert client.get("/api/memory/facts", params={"q": "salary"}, headers=claims_default).json() == []
        assert "salary" not in client.get("/api/memory/export", headers=claims_default).text
        path = f"/api/memory/facts/{fallback['id']}"
        assert client.patch(path, json={"content": "hijacked"}, headers=claims_default).status_code == 404
        assert client.delete(path, headers=claims_default).status_code == 404
        add_fact(client, "Written by the header user", claims_default)
        [written] = get_memory_data(user_id=make_safe_user_id("default"))["facts"]
        assert written["content"] == "Written by the header user"
        assert client.delete("/api/memory", headers=claims_default).status_code == 200

        assert get_memory_data(user_id=DEFAULT_USER_ID)["facts"] == [fallback]
    reset_memory_storage()


def test_export_then_import_replaces_the_whole_document(client: TestClient) -> None:
    add_fact(client, "Uses vim", ALICE)
    exported = client.get("/api/memory/export", headers=ALICE).json()
    exported["user"]["workContext"]["summary"] = "Platform team"
    exported["facts"][0]["consolidatedFrom"] = ["fact_0000aaaa"]  # unknown keys survive the trip
    add_fact(client, "Bob's own fact", BOB)

    imported = client.post("/api/memory/import", json=exported, headers=BOB)
    assert imported.status_code == 200
    body = imported.json()
    assert body["user"]["workContext"]["summary"] == "Platform team"
    assert [(f["content"], f["consolidatedFrom"]) for f in body["facts"]] == [("Uses vim", ["fact_0000aaaa"])]
    assert contents(client, BOB) == ["Uses vim"]

    bad = client.post("/api/memory/import", json={"facts": [{"content": "no id"}]}, headers=BOB)
    assert bad.status_code == 422


def test_clear_reload_config_and_status(client: TestClient, sql_url: str) -> None:
    add_fact(client, "Temporary", ALICE)
    cleared = client.delete("/api/memory", headers=ALICE)
    assert cleared.status_code == 200 and cleared.json()["facts"] == []

    # Another process (a second storage instance on the same database) writes; reload sees it.
    outside = create_empty_memory()
    outside["facts"] = [{"id": "fact_0000beef", "content": "Written elsewhere", "confidence": 0.8}]
    assert SqlMemoryStorage(sql_url).save(outside, user_id="alice")
    reloaded = client.post("/api/memory/reload", headers=ALICE)
    assert [f["content"] for f in reloaded.json()["facts"]] == ["Written elsewhere"]

    config = client.get("/api/memory/config", headers=ALICE).json()
    assert config["max_facts"] == 100 and config["guaranteed_categories"] == ["correction"]
    assert "database_url" not in config and "llm_api_key" not in config
    status = client.get("/api/memory/status", headers=ALICE).json()
    assert status["config"] == config
    assert [f["id"] for f in status["data"]["facts"]] == ["fact_0000beef"]


def test_openapi_documents_every_endpoint_and_its_errors(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    codes = {
        (method.upper(), path): set(operation["responses"])
        for path, operations in paths.items()
        for method, operation in operations.items()
    }
    assert codes == {
        ("GET", "/api/memory"): {"200", "400", "422", "503"},
        ("DELETE", "/api/memory"): {"200", "400", "422", "503"},
        ("POST", "/api/memory/reload"): {"200", "400", "422", "503"},
        ("GET", "/api/memory/export"): {"200", "400", "422", "503"},
        ("POST", "/api/memory/import"): {"200", "400", "403", "422", "503"},
        ("GET", "/api/memory/facts"): {"200", "400", "422", "503"},
        ("POST", "/api/memory/facts"): {"200", "400", "403", "409", "422", "503"},
        ("PATCH", "/api/memory/facts/{fact_id}"): {"200", "400", "403", "404", "409", "422", "503"},
        ("DELETE", "/api/memory/facts/{fact_id}"): {"200", "400", "404", "409", "422", "503"},
        ("GET", "/api/memory/config"): {"200", "422"},
        ("GET", "/api/memory/status"): {"200", "400", "422", "503"},
        ("GET", "/api/memory/sessions"): {"200", "400", "422", "503"},
        ("GET", "/api/memory/sessions/{session_id}"): {"200", "400", "404", "422", "503"},
        ("GET", "/api/memory/sessions/{session_id}/context"): {"200", "400", "422", "503"},
        ("POST", "/api/memory/sessions/{session_id}/turns"): {"200", "400", "413", "422", "429", "503"},
        ("DELETE", "/api/memory/sessions/{session_id}"): {"200", "400", "404", "422", "503"},
        ("GET", "/api/memory/agents/{agent_name}/documents"): {"200", "400", "422", "503"},
        ("GET", "/api/memory/agents/{agent_name}/document"): {"200", "400", "404", "422", "503"},
        ("PUT", "/api/memory/agents/{agent_name}/document"): {
            "200",
            "400",
            "403",
            "409",
            "413",
            "422",
            "503",
        },
        ("PATCH", "/api/memory/agents/{agent_name}/document"): {
            "200",
            "400",
            "403",
            "404",
            "409",
            "413",
            "422",
            "503",
        },
        ("DELETE", "/api/memory/agents/{agent_name}/document"): {
            "200",
            "400",
            "403",
            "404",
            "409",
            "422",
            "503",
        },
        ("GET", "/api/memory/agents/{agent_name}/history"): {"200", "400", "403", "422", "503"},
    }
    for operations in paths.values():
        for operation in operations.values():
            for code, response in operation["responses"].items():
                assert "schema" in response["content"]["application/json"], (operation["summary"], code)


@pytest.mark.postgres
def test_database_outage_is_503(postgres_url: str, tmp_path: Path) -> None:
    with build_client(postgres_url, tmp_path) as client:
        add_fact(client, "Before the outage", ALICE)
        # The outage: the database disappears under the running storage, its connections killed.
        url = make_url(postgres_url)
        admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{url.database}" WITH (FORCE)'))
        admin.dispose()

        for method, path, body in [
            ("GET", "/api/memory", None),
            ("POST", "/api/memory/reload", None),
            ("POST", "/api/memory/facts", {"content": "During the outage"}),
            ("GET", "/api/memory/status", None),
        ]:
            response = client.request(method, path, json=body, headers=ALICE)
            assert response.status_code == 503, (path, response.text)
            assert response.json() == {"detail": "Memory storage is unavailable; try again later."}
    reset_memory_storage()


def test_a_refused_write_is_503(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    with build_client(f"sqlite:///{path}", tmp_path) as client:
        add_fact(client, "Stored while writable", ALICE)
    dispose_engines()
    # The same database opened read-only: reads work, every save is refused by SQLite.
    with build_client(f"sqlite:///file:{path}?mode=ro&uri=true", tmp_path) as client:
        assert contents(client, ALICE) == ["Stored while writable"]
        refused = client.post("/api/memory/facts", json={"content": "Not stored"}, headers=ALICE)
        assert refused.status_code == 503
        assert client.delete("/api/memory", headers=ALICE).status_code == 503
        assert contents(client, ALICE) == ["Stored while writable"]
    reset_memory_storage()
    dispose_engines()


def test_import_without_the_extra_names_it() -> None:
    code = "import sys; sys.modules['fastapi'] = None; import memstore.integrations.fastapi"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "pip install 'memstore[server]'" in result.stderr


def test_oversized_and_unstorable_input_is_422_and_changes_nothing(client: TestClient) -> None:
    fact = add_fact(client, "Likes tea", ALICE)
    too_long = "x" * (MAX_FACT_CHARS + 1)
    for method, path, body in [
        ("POST", "/api/memory/facts", {"content": too_long}),
        ("POST", "/api/memory/facts", {"content": "ok", "category": "c" * (MAX_CATEGORY_CHARS + 1)}),
        ("PATCH", f"/api/memory/facts/{fact['id']}", {"content": too_long}),
        ("POST", "/api/memory/facts", {"content": "a\x00b"}),  # PostgreSQL cannot store NUL: was a 503
        ("PATCH", f"/api/memory/facts/{fact['id']}", {"category": "a\x00b"}),
    ]:
        response = client.request(method, path, json=body, headers=ALICE)
        assert response.status_code == 422, (method, body, response.text)
        assert response.json()["detail"][0]["loc"][:2] in (["body", "content"], ["body", "category"])
        assert len(response.content) < 1000  # the rejected input is not echoed back
    refused = client.post("/api/memory/facts", json={"content": "ZQX-marker\x00"}, headers=ALICE)
    assert refused.json()["detail"] == [
        {
            "loc": ["body", "content"],
            "msg": "content: contains NUL (U+0000), which cannot be stored",
            "type": "value_error",
        }
    ]
    for params in ({"q": "a\x00b"}, {"q": "x" * (MAX_FACT_CHARS + 1)}, {"q": "tea", "category": "a\x00"}):
        response = client.get("/api/memory/facts", params=params, headers=ALICE)
        assert response.status_code == 422, (params, response.text)  # NUL in q: was a 500

    exported = client.get("/api/memory/export", headers=ALICE).json()
    deep: object = "bottom"
    for _ in range(MAX_DOCUMENT_DEPTH + 1):
        deep = [deep]
    changes: list[dict[str, Any]] = [
        {"facts": [{"id": "f1", "content": too_long}]},
        {"facts": [{"id": f"f{n}", "content": f"fact {n}"} for n in range(MAX_DOCUMENT_FACTS + 1)]},
        {"user": {"workContext": {"summary": "s" * (MAX_SUMMARY_CHARS + 1)}}},
        {"facts": [{"id": "f1", "content": "deep", "nested": deep}]},
        {"facts": [{"id": "f1", "content": "nul", "note": "a\x00b"}]},
    ]
    for change in changes:
        response = client.post("/api/memory/import", json={**exported, **change}, headers=ALICE)
        assert response.status_code == 422, (str(change)[:80], response.text[:300])
    assert contents(client, ALICE) == ["Likes tea"]


def test_nan_and_lone_surrogates_in_a_body_are_a_clean_422(client: TestClient) -> None:
    headers = {**ALICE, "Content-Type": "application/json"}
    for body in [
        '{"content": "x", "confidence": NaN}',
        '{"content": "x", "confidence": Infinity}',
        '{"content": "a\\ud800"}',
        '{"\\ud800": 1}',
        '{"content": "\\udfff", "confidence": NaN}',
    ]:
        response = client.post("/api/memory/facts", content=body, headers=headers)
        assert response.status_code == 422, (body, response.text)
        for error in response.json()["detail"]:
            assert set(error) == {"loc", "msg", "type"}, body
    nan_extra = '{"facts": [{"id": "f", "content": "x", "extra": NaN}]}'
    assert client.post("/api/memory/import", content=nan_extra, headers=headers).status_code == 422
    assert contents(client, ALICE) == []
    ignored_key = '{"facts": [{"id": "f", "content": "kept"}], "\\ud800": 1}'  # unknown keys are dropped
    assert client.post("/api/memory/import", content=ignored_key, headers=headers).status_code == 200
    assert contents(client, ALICE) == ["kept"]


def test_write_endpoints_answer_with_what_was_stored(client: TestClient) -> None:
    # Issue 14.3: each write returned the caller's copy with the lastUpdated it was loaded with.
    unstored = client.get("/api/memory", headers=ALICE).json()
    assert unstored["lastUpdated"] == "" and unstored["facts"] == []  # issue 14.5: nothing stored

    def answered_then_read(response: Any) -> tuple[Any, Any]:
        assert response.status_code == 200, response.text
        time.sleep(0.002)  # two stamps taken at different times must differ
        return response.json(), client.get("/api/memory", headers=ALICE).json()

    fact = add_fact(client, "Prefers tea", ALICE)
    time.sleep(0.002)
    writes: list[Callable[[], Any]] = [
        lambda: client.post("/api/memory/facts", json={"content": "Likes jazz"}, headers=ALICE),
        lambda: client.patch(
            f"/api/memory/facts/{fact['id']}", json={"content": "Prefers green tea"}, headers=ALICE
        ),
        lambda: client.delete(f"/api/memory/facts/{fact['id']}", headers=ALICE),
        lambda: client.delete("/api/memory", headers=ALICE),
    ]
    stamps = []
    for write in writes:
        answered, stored = answered_then_read(write())
        assert answered["lastUpdated"] == stored["lastUpdated"] != ""
        assert answered["facts"] == stored["facts"]
        stamps.append(answered["lastUpdated"])
    assert len(set(stamps)) == len(stamps), "each write stamps a new lastUpdated"


def test_manual_categories_are_checked(client: TestClient) -> None:
    # Issue 14.10: PATCH with "not-a-category" was stored. Manual edits take the six categories.
    fact = add_fact(client, "Likes tea", ALICE, category="Preference")
    assert fact["category"] == "preference"
    for method, path, body in [
        ("POST", "/api/memory/facts", {"content": "x", "category": "not-a-category"}),
        ("PATCH", f"/api/memory/facts/{fact['id']}", {"category": "not-a-category"}),
    ]:
        response = client.request(method, path, json=body, headers=ALICE)
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["loc"] == ["body", "category"]
        assert "preference, knowledge" in response.json()["detail"][0]["msg"]
    assert [
        (f["content"], f["category"]) for f in client.get("/api/memory", headers=ALICE).json()["facts"]
    ] == [("Likes tea", "preference")]


def test_an_import_with_a_blank_fact_or_a_huge_unknown_key_is_422(client: TestClient) -> None:
    # Review of issue 13: a blank fact reached the SQL codec and came back as 503 "try again later",
    # and a 3,000,000-character unknown key was stored, then sent in every update prompt.
    blank = create_empty_memory() | {"facts": [{"id": "fact_00000001", "content": "   "}]}
    huge = create_empty_memory() | {
        "facts": [{"id": "fact_00000001", "content": "ok", "notes": "n" * 3_000_000}]
    }
    for document in (blank, huge):
        response = client.post("/api/memory/import", json=document, headers=ALICE)
        assert response.status_code == 422, response.text[:300]
    assert client.get("/api/memory", headers=ALICE).json()["facts"] == []


def test_fact_objects_carry_read_only_retention_signals(client: TestClient) -> None:
    added = add_fact(client, "Alice deploys with Helm", ALICE, confidence=0.8)
    assert added["retention"]["accessCount"] == 0 and "lastAccessedAt" not in added["retention"]
    assert 0 < added["retention"]["score"] <= 1
    found = client.get("/api/memory/facts", params={"q": "Helm"}, headers=ALICE).json()
    assert [fact["id"] for fact in found] == [added["id"]]
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage) and storage.flush_access() == 1
    [shown] = client.get("/api/memory", headers=ALICE).json()["facts"]
    assert shown["retention"]["accessCount"] == 1 and shown["retention"]["lastAccessedAt"]
    assert shown["retention"]["score"] > added["retention"]["score"]  # heat counts
    # Read-only: an import that sets it (an export imported again) does not store it, and a
    # fact's own keys that share the old flat names survive.
    exported = client.get("/api/memory/export", headers=ALICE).json()
    exported["facts"][0]["retention"] = {"accessCount": 99, "score": 1.0, "lastConfirmedAt": "2020-01-01Z"}
    exported["facts"][0]["accessCount"] = "tool-owned"
    assert client.post("/api/memory/import", json=exported, headers=ALICE).status_code == 200
    stored = storage.reload(user_id="alice")["facts"][0]
    assert "retention" not in stored and stored["accessCount"] == "tool-owned"
    [after] = client.get("/api/memory", headers=ALICE).json()["facts"]
    assert after["retention"]["accessCount"] == 1 and "lastConfirmedAt" not in after["retention"]
    assert after["accessCount"] == "tool-owned"
    assert client.get("/api/memory", headers=BOB).json()["facts"] == []
