"""The memory-record fields (issue 32) through every entry point that takes a fact: the HTTP router
(FastAPI's TestClient), MCP (the SDK's client against ``memstore mcp``), tool mode, and the
operator CLI (``facts list`` filters, ``facts show``) in a subprocess. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from memstore.gateway.tools import memory_add, memory_search, memory_update
from memstore.ops.facts import get_memory_data
from memstore.record import RECORD_KEYS
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from tests.integration.conftest import Cli
from tests.integration.test_fastapi_router import ALICE, build_client
from tests.integration.test_mcp_server import _stdio_client
from tests.support.mcp_client import call_tool, tool_error

REQUEST: dict[str, Any] = {
    "memory_type": "procedural",
    "importance": 0.9,
    "tags": ["work", "editor"],
    "source_kind": "explicit_user_input",
    "raw": "I always use vim",
    "structured": {"editor": "vim"},
}
DOCUMENT_KEYS = {
    "type": "procedural",
    "importance": 0.9,
    "tags": ["editor", "work"],
    "sourceKind": "explicit_user_input",
    "raw": "I always use vim",
    "structured": {"editor": "vim"},
}


def _record_keys(fact: dict[str, Any]) -> dict[str, Any]:
    return {key: fact[key] for key in RECORD_KEYS if key in fact}


# -- HTTP ------------------------------------------------------------------------------------------


@pytest.fixture
def client(sql_url: str, tmp_path: Path) -> Iterator[TestClient]:
    with build_client(sql_url, tmp_path) as test_client:
        yield test_client
    reset_memory_storage()


def _only(response: Any, content: str) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    [fact] = [fact for fact in response.json()["facts"] if fact["content"] == content]
    return dict(fact)


def test_http_creates_patches_and_returns_the_record_fields(client: TestClient) -> None:
    created = _only(
        client.post("/api/memory/facts", json={"content": "Alice edits in vim", **REQUEST}, headers=ALICE),
        "Alice edits in vim",
    )
    assert _record_keys(created) == DOCUMENT_KEYS
    assert created["retention"]["score"] > 0
    plain = _only(
        client.post("/api/memory/facts", json={"content": "Alice drinks tea"}, headers=ALICE),
        "Alice drinks tea",
    )
    assert _record_keys(plain) == {}  # a fact that sets none reads as DeerFlow's

    [found] = client.get("/api/memory/facts", params={"q": "vim"}, headers=ALICE).json()
    assert _record_keys(found) == DOCUMENT_KEYS
    patched = _only(
        client.patch(
            f"/api/memory/facts/{created['id']}",
            json={"importance": 0.5, "tags": [], "raw": "", "source_kind": "corrected_memory"},
            headers=ALICE,
        ),
        "Alice edits in vim",
    )
    assert _record_keys(patched) == {
        "type": "procedural",
        "sourceKind": "corrected_memory",
        "structured": {"editor": "vim"},
    }
    exported = client.get("/api/memory/export", headers=ALICE).json()
    assert [_record_keys(fact) for fact in exported["facts"]] == [_record_keys(patched), {}]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"importance": 1.5}, "importance"),
        ({"memory_type": "habit"}, "memory_type"),
        ({"source_kind": "rumour"}, "source_kind"),
        ({"tags": ["a,b"]}, "tags"),
        ({"tags": [f"t{i}" for i in range(17)]}, "tags"),
        ({"raw": "r" * 4001}, "raw"),
        ({"structured": {"a": {"b": {"c": {"d": {}}}}}}, "structured"),
    ],
)
def test_http_refuses_a_bad_record_field_with_a_422_naming_it(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    response = client.post("/api/memory/facts", json={"content": "Alice drinks tea", **body}, headers=ALICE)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][-1] == field
    assert client.get("/api/memory", headers=ALICE).json()["facts"] == []


def test_http_import_checks_and_carries_the_record_keys(client: TestClient) -> None:
    document = {
        "facts": [
            {"id": "f1", "content": "Alice edits in vim", **DOCUMENT_KEYS},
            {
                "id": "f2",
                "content": "Alice used emacs",
                "relations": [{"type": "supersedes", "target": "f1"}],
            },
        ]
    }
    imported = client.post("/api/memory/import", json=document, headers=ALICE)
    assert imported.status_code == 200, imported.text
    first, second = imported.json()["facts"]
    assert _record_keys(first) == DOCUMENT_KEYS
    assert second["relations"] == [{"type": "supersedes", "target": "f1"}]
    bad = {"facts": [{"id": "f1", "content": "x", "importance": "0.7"}]}
    refused = client.post("/api/memory/import", json=bad, headers=ALICE)
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["msg"] == "fact 0: importance: must be a number between 0 and 1"
    assert len(client.get("/api/memory", headers=ALICE).json()["facts"]) == 2


# -- tool mode -------------------------------------------------------------------------------------


def test_tool_mode_takes_and_returns_the_record_fields(sql_storage: SqlMemoryStorage) -> None:
    added = json.loads(memory_add("Alice edits in vim", "preference", user_id="alice", **REQUEST))
    assert added["status"] == "added"
    [stored] = get_memory_data(user_id="alice")["facts"]
    assert _record_keys(stored) == DOCUMENT_KEYS
    [found] = json.loads(memory_search("vim", user_id="alice"))["results"]
    assert _record_keys(found) == DOCUMENT_KEYS
    updated = json.loads(memory_update(added["fact_id"], importance=0.1, tags=["home"], user_id="alice"))
    assert updated["status"] == "updated"
    [stored] = get_memory_data(user_id="alice")["facts"]
    assert (stored["importance"], stored["tags"]) == (0.1, ["home"])
    refused = json.loads(memory_add("Alice drinks tea", source_kind="rumour", user_id="alice"))  # type: ignore[arg-type]
    assert refused["error"].startswith("source_kind: must be one of explicit_user_input")
    refused = json.loads(memory_update(added["fact_id"], structured={"a": float("nan")}, user_id="alice"))
    assert refused == {"error": "structured: must hold only JSON values (no NaN)"}


# -- MCP -------------------------------------------------------------------------------------------


def test_mcp_tools_take_and_return_the_record_fields(cli: Cli) -> None:
    async def session() -> None:
        async with _stdio_client(cli, "--user", "alice") as client:
            listed = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
            schema = json.dumps(listed["memory_add"])
            assert '"procedural"' in schema and '"corrected_memory"' in schema
            added = await call_tool(
                client, "memory_add", content="Alice edits in vim", category="preference", **REQUEST
            )
            [found] = (await call_tool(client, "memory_search", query="vim"))["results"]
            assert found["id"] == added["fact_id"] and _record_keys(found) == DOCUMENT_KEYS
            await call_tool(client, "memory_update", fact_id=added["fact_id"], memory_type="episodic", raw="")
            [found] = (await call_tool(client, "memory_search", query="vim"))["results"]
            assert found["type"] == "episodic" and "raw" not in found
            assert "importance" in await tool_error(client, "memory_add", content="x", importance=2)
            assert "importance" in await tool_error(client, "memory_add", content="x", importance="0.5")
            assert "memory_type" in await tool_error(client, "memory_add", content="x", memory_type="habit")
            refused = await tool_error(client, "memory_add", content="x", tags=["a,b"])
            assert refused.endswith("tags: each tag must be 1 to 64 printable characters without a comma")

    asyncio.run(session())


# -- CLI -------------------------------------------------------------------------------------------


def _tree(root: Path) -> Path:
    facts = [
        {"id": "vim", "content": "Alice edits in vim", "category": "preference", **DOCUMENT_KEYS},
        {
            "id": "emacs",
            "content": "Alice used emacs",
            "category": "behavior",
            "importance": 0.2,
            "tags": ["work"],
            "relations": [{"type": "related_to", "target": "vim"}],
        },
        {
            "id": "fix",
            "content": "Alice switched from emacs to vim",
            "category": "correction",
            "sourceKind": "corrected_memory",
            "relations": [{"type": "supersedes", "target": "emacs"}, {"type": "related_to", "target": "vim"}],
        },
        {"id": "tea", "content": "Alice drinks tea", "category": "preference"},
    ]
    path = root / "users" / "alice" / "memory.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"facts": facts}), encoding="utf-8")
    return root


@pytest.fixture
def seeded(cli: Cli, tmp_path: Path) -> Cli:
    result = cli("import", str(_tree(tmp_path / "tree")))
    assert result.returncode == 0, result.stderr
    return cli


def _ids(cli: Cli, *args: str) -> set[str]:
    return {fact["fact_id"] for fact in cli.json("facts", "list", *args)["facts"]}


def test_cli_facts_list_filters_by_the_record_fields(seeded: Cli) -> None:
    assert _ids(seeded, "--type", "procedural") == {"vim", "emacs"}  # emacs: behavior's type
    assert _ids(seeded, "--type", "preference") == {"tea"}
    assert _ids(seeded, "--tag", "work") == {"vim", "emacs"}
    assert _ids(seeded, "--tag", " editor ", "--user", "alice") == {"vim"}
    assert _ids(seeded, "--min-importance", "0.6") == {"vim"}
    assert _ids(seeded, "--min-importance", "0.5") == {"vim", "fix", "tea"}
    assert _ids(seeded, "--source-kind", "corrected_memory") == {"fix"}
    assert _ids(seeded, "--source-kind", "implicit_inference", "--type", "procedural") == {"emacs"}
    page = seeded.json("facts", "list", "--tag", "editor")
    [vim] = page["facts"]
    assert (vim["memory_type"], vim["importance"], vim["tags"], vim["source_kind"]) == (
        "procedural",
        0.9,
        ["editor", "work"],
        "explicit_user_input",
    )
    assert vim["raw"] == "I always use vim" and vim["structured"] == {"editor": "vim"}
    assert vim["version"] == 1 and vim["decay"] == 0.0  # no createdAt, never confirmed: nothing fresh
    table = seeded("facts", "list", "--retention", "--tag", "editor")
    assert table.returncode == 0 and "DECAY" in table.stdout
    found = seeded.json("facts", "search", "vim", "--type", "semantic")
    assert [fact["fact_id"] for fact in found["facts"]] == ["fix"]  # correction's type


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--type", "habit"], "Invalid value for '--type'"),
        (["--source-kind", "rumour"], "Invalid value for '--source-kind'"),
        (["--min-importance", "1.5"], "'--min-importance': 1.5 is not in the range 0<=x<=1"),
        (["--tag", "a,b"], "Invalid value for '--tag': each tag must be 1 to 64 printable characters"),
    ],
)
def test_cli_bad_record_filters_are_usage_errors(seeded: Cli, args: list[str], message: str) -> None:
    result = seeded("facts", "list", *args)
    assert result.returncode == 2 and message in result.stderr


def test_cli_facts_show_lists_the_record_and_relations_both_ways(seeded: Cli) -> None:
    shown = seeded("facts", "show", "emacs", "--user", "alice")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "fact emacs of alice / - (private)"
    assert "  tags:        work" in lines and "  type:        procedural" in lines
    assert "  importance:  0.20" in lines and "  version:     1" in lines
    assert lines[lines.index("relations (2):") + 1 :] == [
        "  this related_to vim",
        "  fix supersedes this",
    ]
    data = seeded.json("facts", "show", "vim")
    [fact] = data["facts"]
    assert fact["relations"] == {
        "fact_id": "vim",
        "outgoing": [],
        "incoming": [
            {"kind": "related_to", "source": "emacs", "live": True},
            {"kind": "related_to", "source": "fix", "live": True},
        ],
    }
    assert fact["structured"] == {"editor": "vim"} and fact["decay"] == 0.0
    missing = seeded("facts", "show", "nope", "--user", "alice")
    assert missing.returncode == 4 and "no live fact 'nope' matches" in missing.stderr
    assert seeded("facts", "show", "vim", "--user", "bob").returncode == 4
