"""Short-term session memory (issue 33) through its entry points: the HTTP routes under
``/api/memory/sessions``, the MCP ``session_*`` tools (the SDK's own client against ``memstore
mcp``) and ``memstore sessions list|show|clear``, on SQLite and PostgreSQL.

Each entry point acts for the identity its server decides (the gateway's dependency, the MCP
server's ``--user`` and ``--agent``, the operator's ``--user``); another user or tenant sees
nothing of a session and cannot clear it. No session here reaches ``session_max_turns``, so no
compression runs behind a test's back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient
from mcp import Client, StdioServerParameters
from pydantic import SecretStr

from memstore.cli.exit_codes import EXIT_NOTHING_MATCHED, EXIT_USAGE
from memstore.config import SQL_STORAGE_CLASS, MemoryConfig, set_memory_config
from memstore.errors import STORAGE_UNAVAILABLE_MESSAGE
from memstore.integrations.fastapi import create_memory_router
from memstore.integrations.fastapi_errors import LIMIT_HEADER
from memstore.integrations.fastapi_sessions import MAX_APPEND_BODY_BYTES
from memstore.ops.sessions import append_turns
from memstore.scope import make_safe_user_id
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sessions.loader import reset_session_stores
from tests.integration.conftest import Cli
from tests.support.mcp_client import call_tool, memstore_command, tool_error

IDENTITIES = {"alice": ("alice", None), "bob": ("bob", None), "alice-acme": ("alice", "acme")}
ALICE = {"Authorization": "Bearer alice"}
BOB = {"Authorization": "Bearer bob"}
ALICE_ACME = {"Authorization": "Bearer alice-acme"}
MARKER = "ZQX-marker-7f3a "  # distinctive: an error that echoed the submitted text would show it
ORDER_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "My order 1234 has not arrived"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "track", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "name": "track", "content": "order 1234: in transit, due Friday"},
    {"role": "assistant", "content": "It is in transit and due on Friday."},
]


def _identity(authorization: str) -> tuple[str, str | None]:
    found = IDENTITIES.get(authorization.removeprefix("Bearer "))
    if found is None:
        raise HTTPException(401, "not authenticated")
    return found


def gateway_user(authorization: str = Header(default="")) -> str:
    return _identity(authorization)[0]


def gateway_tenant(authorization: str = Header(default="")) -> str | None:
    return _identity(authorization)[1]


MakeClient = Callable[..., TestClient]


@pytest.fixture
def make_client(sql_url: str, tmp_path: Path) -> Iterator[MakeClient]:
    """A gateway on ``sql_url`` with the router's session routes; ``settings`` set the caps."""

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
        reset_session_stores()
        app = FastAPI()
        app.include_router(create_memory_router(gateway_user, current_tenant_id=gateway_tenant))
        return TestClient(app)

    yield make
    reset_session_stores()
    reset_memory_storage()


def _append(client: TestClient, session_id: str, turns: list[dict[str, Any]], headers: dict[str, str]) -> Any:
    response = client.post(f"/api/memory/sessions/{session_id}/turns", json={"turns": turns}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def _messages(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns as stored messages: role, content, and name and tool_calls only when set."""
    return [
        {key: turn[key] for key in ("role", "content", "name", "tool_calls") if key in turn} for turn in turns
    ]


# -- HTTP ---------------------------------------------------------------------------------------


def test_http_append_show_context_list_clear(make_client: MakeClient) -> None:
    client = make_client()
    first = _append(client, "order-1234", ORDER_TURNS[:2], ALICE)
    assert [turn["seq"] for turn in first["turns"]] == [1, 2]
    assert first["turns"][1]["tool_calls"] == ORDER_TURNS[1]["tool_calls"]
    assert "name" not in first["turns"][0]  # only the fields a turn has, as a chat message
    second = _append(client, "order-1234", ORDER_TURNS[2:], ALICE)
    assert [turn["seq"] for turn in second["turns"]] == [3, 4]
    info = second["session"]
    assert (info["sessionId"], info["userId"], info["agentName"], info["tenantId"]) == (
        "order-1234",
        "alice",
        None,
        "default",
    )
    assert info["turnCount"] == 4 and info["compressions"] == 0

    shown = client.get("/api/memory/sessions/order-1234", headers=ALICE)
    assert shown.status_code == 200, shown.text
    stored = shown.json()["turns"]
    assert [turn["seq"] for turn in stored] == [1, 2, 3, 4]
    assert _messages(stored) == ORDER_TURNS
    assert shown.json()["session"]["tokenCount"] == sum(turn["tokens"] for turn in stored)

    context = client.get("/api/memory/sessions/order-1234/context", headers=ALICE).json()
    assert context == {
        "messages": ORDER_TURNS,
        "summary": None,
        "omitted": 0,
        "tokens": sum(turn["tokens"] for turn in stored),
    }
    budget = stored[-1]["tokens"]  # room for the newest turn only
    tight = client.get(
        "/api/memory/sessions/order-1234/context", params={"max_tokens": budget}, headers=ALICE
    ).json()
    assert (tight["messages"], tight["omitted"], tight["tokens"]) == ([ORDER_TURNS[-1]], 3, budget)

    _append(client, "returns", [{"role": "user", "content": "How do I return a lamp?"}], ALICE)
    listed = client.get("/api/memory/sessions", headers=ALICE).json()
    assert [item["sessionId"] for item in listed["sessions"]] == ["returns", "order-1234"]
    assert (listed["limit"], listed["offset"]) == (100, 0)
    assert listed["sessions"][1]["turnCount"] == 4
    page = client.get("/api/memory/sessions", params={"limit": 1, "offset": 1}, headers=ALICE).json()
    assert [item["sessionId"] for item in page["sessions"]] == ["order-1234"]

    cleared = client.delete("/api/memory/sessions/order-1234", headers=ALICE)
    assert cleared.status_code == 200 and cleared.json() == {"sessionId": "order-1234", "cleared": True}
    assert client.get("/api/memory/sessions/order-1234", headers=ALICE).status_code == 404
    assert client.delete("/api/memory/sessions/order-1234", headers=ALICE).status_code == 404
    empty = client.get("/api/memory/sessions/order-1234/context", headers=ALICE).json()
    assert empty == {"messages": [], "summary": None, "omitted": 0, "tokens": 0}
    listed = client.get("/api/memory/sessions", headers=ALICE).json()
    assert [item["sessionId"] for item in listed["sessions"]] == ["returns"]


def test_http_another_user_or_tenant_sees_nothing_and_cannot_clear(make_client: MakeClient) -> None:
    client = make_client()
    _append(client, "s1", [{"role": "user", "content": "my PIN hint is tea"}], ALICE)
    for other in (BOB, ALICE_ACME):
        assert client.get("/api/memory/sessions/s1", headers=other).status_code == 404
        context = client.get("/api/memory/sessions/s1/context", headers=other)
        assert context.json()["messages"] == [] and "PIN" not in context.text
        assert client.get("/api/memory/sessions", headers=other).json()["sessions"] == []
        assert client.delete("/api/memory/sessions/s1", headers=other).status_code == 404
    # The same session id in another scope is another session, not an append to alice's.
    bobs = _append(client, "s1", [{"role": "user", "content": "bob here"}], BOB)
    assert (bobs["session"]["userId"], bobs["session"]["turnCount"], bobs["turns"][0]["seq"]) == ("bob", 1, 1)
    assert client.get("/api/memory", headers=BOB).status_code == 200  # the other routes still answer
    assert client.get("/api/memory/sessions", headers={"Authorization": "Bearer nobody"}).status_code == 401

    alices = client.get("/api/memory/sessions/s1", headers=ALICE).json()
    assert [turn["content"] for turn in alices["turns"]] == ["my PIN hint is tea"]
    assert alices["session"]["turnCount"] == 1


def test_http_an_invalid_turn_is_a_422_naming_the_rule_without_echoing_it(make_client: MakeClient) -> None:
    client = make_client(session_max_turn_chars=100)
    too_long = {"role": "user", "content": MARKER * 10}  # 160 characters
    for turns, message in (
        ([too_long], "turn 0: a turn's content is 160 characters, over 100"),
        (
            [{"role": "user", "content": "fine"}, too_long],
            "turn 1: a turn's content is 160 characters, over 100",
        ),
        (
            [{"role": "user", "content": MARKER + "\x00"}],
            "turn 0: a turn's content contains NUL (U+0000), which cannot be stored",
        ),
        (
            [{"role": "robot", "content": MARKER}],
            "turn 0: a turn's role must be one of user, assistant, tool",
        ),
    ):
        response = client.post("/api/memory/sessions/s1/turns", json={"turns": turns}, headers=ALICE)
        assert response.status_code == 422, response.text
        [error] = response.json()["detail"]
        assert error["loc"] == ["body", "turns"] and error["msg"] == message, error
        assert "ZQX" not in response.text
    # Nothing of a refused append was stored, not even its valid first turn.
    assert client.get("/api/memory/sessions/s1", headers=ALICE).status_code == 404


def test_http_a_write_past_a_cap_is_a_429_saying_which(make_client: MakeClient) -> None:
    client = make_client(session_max_turns=2, session_max_stored_turns=3, session_max_per_user=2)
    four = [{"role": "user", "content": f"turn {index}"} for index in range(4)]
    refused = client.post("/api/memory/sessions/a/turns", json={"turns": four}, headers=ALICE)
    assert refused.status_code == 429, refused.text
    assert refused.headers[LIMIT_HEADER] == "turns"
    assert "session_max_stored_turns" in refused.json()["detail"]
    assert client.get("/api/memory/sessions/a", headers=ALICE).status_code == 404

    one = [{"role": "user", "content": "hello"}]
    _append(client, "a", one, ALICE)
    _append(client, "b", one, ALICE)
    third = client.post("/api/memory/sessions/c/turns", json={"turns": one}, headers=ALICE)
    assert third.status_code == 429 and third.headers[LIMIT_HEADER] == "sessions"
    assert "session_max_per_user" in third.json()["detail"]
    assert client.get("/api/memory/sessions/c", headers=ALICE).status_code == 404
    _append(client, "c", one, BOB)  # the cap is per user
    listed = client.get("/api/memory/sessions", headers=ALICE).json()["sessions"]
    assert sorted(item["sessionId"] for item in listed) == ["a", "b"]


def test_http_bad_ids_bodies_and_bounds_are_refused_before_the_store(make_client: MakeClient) -> None:
    client = make_client()
    one = {"turns": [{"role": "user", "content": "hello"}]}
    for path in ("/api/memory/sessions/bad%20id", "/api/memory/sessions/" + "x" * 129):
        for response in (
            client.get(path, headers=ALICE),
            client.get(path + "/context", headers=ALICE),
            client.post(path + "/turns", json=one, headers=ALICE),
            client.delete(path, headers=ALICE),
        ):
            assert response.status_code == 422, (path, response.text)
            assert response.json()["detail"][0]["loc"] == ["path", "session_id"]

    def refused(body: Any) -> list[Any]:
        response = client.post("/api/memory/sessions/s1/turns", json=body, headers=ALICE)
        assert response.status_code == 422, response.text
        return [error["loc"] for error in response.json()["detail"]]

    assert refused({"turns": []}) == [["body", "turns"]]
    assert refused({"turns": one["turns"] * 101}) == [["body", "turns"]]
    assert refused({"turns": [{"role": "user", "content": "hi", "text": "x"}]}) == [
        ["body", "turns", 0, "text"]
    ]
    assert refused({"turns": [{"role": "user", "content": "hi", "name": "n" * 129}]}) == [
        ["body", "turns", 0, "name"]
    ]
    for params in ({"max_tokens": 0}, {"max_tokens": 100_001}):
        response = client.get("/api/memory/sessions/s1/context", params=params, headers=ALICE)
        assert response.status_code == 422, response.text
    for params in ({"limit": 0}, {"limit": 1001}, {"offset": -1}):
        assert client.get("/api/memory/sessions", params=params, headers=ALICE).status_code == 422

    oversized = b'{"turns": [{"role": "user", "content": "' + b"a" * MAX_APPEND_BODY_BYTES + b'"}]}'
    response = client.post(
        "/api/memory/sessions/s1/turns",
        content=oversized,
        headers={**ALICE, "Content-Type": "application/json"},
    )
    assert response.status_code == 413 and str(MAX_APPEND_BODY_BYTES) in response.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield oversized[: len(oversized) // 2]
        yield oversized[len(oversized) // 2 :]

    response = client.post(
        "/api/memory/sessions/s1/turns",
        content=chunks(),
        headers={**ALICE, "Content-Type": "application/json"},
    )
    assert response.status_code == 413
    assert client.get("/api/memory/sessions", headers=ALICE).json()["sessions"] == []


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_http_a_session_store_outage_is_a_503_with_the_cause_logged(
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    down = f"redis://:s3cret@127.0.0.1:{_closed_port()}/0"
    set_memory_config(
        MemoryConfig(
            data_dir=str(tmp_path / "data"),
            database_url=sqlite_url,
            session_backend="redis",
            session_redis_url=SecretStr(down),
        )
    )
    reset_session_stores()
    app = FastAPI()
    app.include_router(create_memory_router(lambda: "alice"))
    client = TestClient(app)
    with caplog.at_level(logging.WARNING, logger="memstore.integrations.fastapi_errors"):
        for response in (
            client.post("/api/memory/sessions/s1/turns", json={"turns": [{"role": "user", "content": "x"}]}),
            client.get("/api/memory/sessions"),
            client.get("/api/memory/sessions/s1/context"),
        ):
            assert response.status_code == 503
            assert response.json() == {"detail": STORAGE_UNAVAILABLE_MESSAGE}
    causes = [record.getMessage() for record in caplog.records]
    assert len(causes) == 3 and all("answered 503, session store" in cause for cause in causes), causes
    assert not any("s3cret" in cause for cause in causes)


# -- MCP ----------------------------------------------------------------------------------------

SESSION_TOOLS = ["session_append", "session_clear", "session_context", "session_list"]


def _stdio_client(cli: Cli, *args: str) -> Client:
    env = cli.env | {"MEMSTORE_SESSION_MAX_TURN_CHARS": "100", "MEMSTORE_SESSION_MAX_PER_USER": "2"}
    return Client(StdioServerParameters(command=memstore_command(), args=["mcp", *args], env=env))


def test_mcp_session_tools_under_the_servers_identity(cli: Cli) -> None:
    """Each server acts for its own ``--user`` (and ``--agent``); session_max_per_user is 2."""
    turns = ORDER_TURNS[:3]

    async def alice() -> None:
        async with _stdio_client(cli, "--user", "alice") as client:
            listed = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
            assert set(SESSION_TOOLS) <= set(listed)
            assert all("user_id" not in str(listed[name]) for name in SESSION_TOOLS)

            appended = await call_tool(client, "session_append", session_id="chat-1", turns=turns[:2])
            assert appended["appended"] == [1, 2] and appended["session"]["userId"] == "alice"
            again = await call_tool(client, "session_append", session_id="chat-1", turns=turns[2:])
            assert again["appended"] == [3] and again["session"]["turnCount"] == 3

            context = await call_tool(client, "session_context", session_id="chat-1")
            assert (context["messages"], context["summary"], context["omitted"]) == (turns, None, 0)

            oversized = [{"role": "user", "content": MARKER * 10}]
            too_long = await tool_error(client, "session_append", session_id="chat-1", turns=oversized)
            assert too_long.endswith("a turn's content is 160 characters, over 100") and "ZQX" not in too_long
            assert "Invalid session_id" in await tool_error(client, "session_context", session_id="bad id")
            assert "max_tokens" in await tool_error(
                client, "session_context", session_id="chat-1", max_tokens=0
            )

    async def coder() -> None:
        async with _stdio_client(cli, "--user", "alice", "--agent", "coder") as client:
            await call_tool(client, "session_append", session_id="pairing", turns=turns[:1])
            # The agent's sessions are not the user's own: its chat-1 is another session.
            assert (await call_tool(client, "session_context", session_id="chat-1"))["messages"] == []

    async def bob() -> None:
        async with _stdio_client(cli, "--user", "bob") as client:
            assert (await call_tool(client, "session_context", session_id="chat-1"))["messages"] == []
            assert (await call_tool(client, "session_list"))["count"] == 0
            assert (await call_tool(client, "session_clear", session_id="chat-1"))["cleared"] is False
            # A tool argument cannot name another user: the scope is the server's.
            smuggled = await client.call_tool("session_context", {"session_id": "chat-1", "user_id": "alice"})
            assert smuggled.structured_content is not None and smuggled.structured_content["messages"] == []

    async def alice_again() -> None:
        async with _stdio_client(cli, "--user", "alice") as client:
            listed = await call_tool(client, "session_list")
            assert [(item["sessionId"], item["agentName"]) for item in listed["sessions"]] == [
                ("pairing", "coder"),
                ("chat-1", None),
            ]
            capped = await tool_error(client, "session_append", session_id="chat-2", turns=turns[:1])
            assert "session_max_per_user" in capped
            assert (await call_tool(client, "session_clear", session_id="chat-1"))["cleared"] is True
            assert (await call_tool(client, "session_context", session_id="chat-1"))["messages"] == []

    asyncio.run(alice())
    shown = cli.json("sessions", "show", "chat-1", "--user", "alice")  # the CLI reads what MCP stored
    assert [turn["seq"] for turn in shown["turns"]] == [1, 2, 3]
    asyncio.run(coder())
    asyncio.run(bob())
    asyncio.run(alice_again())
    page = cli.json("sessions", "list", "--user", "alice")
    assert [(item["sessionId"], item["agentName"]) for item in page["sessions"]] == [("pairing", "coder")]


# -- CLI ----------------------------------------------------------------------------------------


@pytest.fixture
def seeded(cli: Cli, isolated_config: MemoryConfig, tmp_path: Path) -> Cli:
    """alice's ``support-42`` (3 turns), her ``billing`` with agent ``coder``, her ``support-42`` in
    tenant ``acme``, and a session of the user an e-mail address maps to; written in-process."""
    (tmp_path / "data").mkdir(exist_ok=True)
    isolated_config.database_url = cli.url
    reset_session_stores()
    append_turns("alice", "support-42", ORDER_TURNS[:3])
    append_turns("alice", "billing", ORDER_TURNS[3:], agent_name="coder")
    append_turns("alice", "support-42", ORDER_TURNS[:1], tenant_id="acme")
    append_turns(make_safe_user_id("Alice@Example.com"), "mail", ORDER_TURNS[:1])
    reset_session_stores()
    return cli


def test_cli_sessions_list_and_show(seeded: Cli) -> None:
    page = seeded.json("sessions", "list", "--user", "alice")
    assert [(item["sessionId"], item["agentName"]) for item in page["sessions"]] == [
        ("billing", "coder"),
        ("support-42", None),
    ]
    assert (page["limit"], page["offset"], page["sessions"][1]["turnCount"]) == (100, 0, 3)
    second = seeded.json("sessions", "list", "--user", "alice", "--limit", "1", "--offset", "1")
    assert [item["sessionId"] for item in second["sessions"]] == ["support-42"]
    mapped = seeded.json("sessions", "list", "--user", "Alice@Example.com")  # the id a gateway stored
    assert [item["sessionId"] for item in mapped["sessions"]] == ["mail"]
    text = seeded("sessions", "list", "--user", "alice")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["SESSION", "AGENT", "TURNS", "TOKENS", "COMPRESSIONS", "UPDATED", "EXPIRES"]
    assert [line.split()[:3] for line in lines[1:3]] == [["billing", "coder", "1"], ["support-42", "-", "3"]]
    assert lines[-1] == "showing 1-2 of the sessions of alice"

    shown = seeded.json("sessions", "show", "support-42", "--user", "alice")
    assert shown["session"]["sessionId"] == "support-42" and shown["session"]["turnCount"] == 3
    assert _messages(shown["turns"]) == ORDER_TURNS[:3]
    assert [turn["seq"] for turn in shown["turns"]] == [1, 2, 3]
    text = seeded("sessions", "show", "support-42", "--user", "alice")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("session support-42 of alice: 3 turn(s), ")
    rows = [line.split(maxsplit=4) for line in text.stdout.splitlines()[2:]]
    assert [row[:2] for row in rows] == [["1", "user"], ["2", "assistant"], ["3", "tool"]]
    assert rows[0][-1].endswith("My order 1234 has not arrived")

    last = shown["turns"][-1]["tokens"]  # room for the tool result alone, which needs its call
    tight = seeded.json(
        "sessions", "show", "support-42", "--user", "alice", "--context", "--max-tokens", str(last)
    )
    assert (tight["messages"], tight["summary"], tight["omitted"], tight["tokens"]) == ([], None, 3, 0)
    context = seeded("sessions", "show", "billing", "--user", "alice", "--agent", "coder", "--context")
    assert context.returncode == 0, context.stderr
    assert context.stdout.splitlines()[1].split(maxsplit=1) == ["assistant", ORDER_TURNS[3]["content"]]
    assert context.stdout.splitlines()[-1].startswith("1 message(s), ")

    missing = seeded("sessions", "show", "billing", "--user", "alice")  # it is the agent's session
    assert missing.returncode == EXIT_NOTHING_MATCHED
    assert "no session 'billing' of alice" in missing.stderr


def test_cli_sessions_clear_asks_first(seeded: Cli) -> None:
    refused = seeded("sessions", "clear", "support-42", "--user", "alice")
    assert refused.returncode == EXIT_USAGE and "without --yes" in refused.stderr
    cleared = seeded("sessions", "clear", "support-42", "--user", "alice", "--yes")  # it was still there
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.strip() == "cleared session support-42 of alice"
    again = seeded("sessions", "clear", "support-42", "--user", "alice", "--yes")
    assert again.returncode == EXIT_NOTHING_MATCHED and "no session 'support-42'" in again.stderr
    # The agent's session, and another tenant's session of the same id, are untouched.
    remaining = seeded.json("sessions", "list", "--user", "alice")["sessions"]
    assert [item["sessionId"] for item in remaining] == ["billing"]
    acme = seeded.json("sessions", "list", "--user", "alice", "--tenant", "acme")["sessions"]
    assert [(item["sessionId"], item["turnCount"]) for item in acme] == [("support-42", 1)]


def test_cli_refuses_a_session_backend_it_cannot_reach(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env |= {"MEMSTORE_DATA_DIR": str(tmp_path / "data"), "MEMSTORE_SESSION_BACKEND": "memory"}
    result = Cli(env, url="")("sessions", "list", "--user", "alice")
    assert result.returncode == 1
    assert "session_backend is memory" in result.stderr and "Traceback" not in result.stderr
