"""``memstore mcp`` (issue 20): the SDK's own client against a real server process.

Over stdio the client starts ``memstore mcp`` itself; over streamable HTTP the server runs on a
free port and each client sends the identity header a proxy would set. Both dialects, real
storage: what a tool call claims is checked against the database.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy import create_engine, make_url, text

from memstore.errors import STORAGE_UNAVAILABLE_MESSAGE
from memstore.scope import DEFAULT_USER_ID, make_safe_user_id
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines
from tests.integration.conftest import Cli
from tests.support.mcp_client import call_tool, memstore_command, tool_error

TOOLS = [
    "memory_add",
    "memory_context",
    "memory_delete",
    "memory_delete_file",
    "memory_edit_file",
    "memory_ls",
    "memory_read_file",
    "memory_search",
    "memory_update",
    "memory_write_file",
    "session_append",
    "session_clear",
    "session_context",
    "session_list",
]
HEADER = "X-Memstore-User"
ACCEPT_BOTH = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
STARTUP_ATTEMPTS = 600  # polls 0.1 s apart: generous for a loaded 2-core machine


def _stored(url: str, user_id: str) -> list[str]:
    try:
        return [fact["content"] for fact in SqlMemoryStorage(url).load(user_id=user_id)["facts"]]
    finally:
        dispose_engines()


def _stdio_client(cli: Cli, *args: str) -> Client:
    return Client(StdioServerParameters(command=memstore_command(), args=["mcp", *args], env=cli.env))


def test_stdio_session_runs_every_tool_against_the_database(cli: Cli) -> None:
    async def session() -> None:
        async with _stdio_client(cli, "--user", "alice") as client:
            listed = await client.list_tools()
            assert sorted(tool.name for tool in listed.tools) == TOOLS
            schema = {tool.name: tool.input_schema for tool in listed.tools}
            assert "user_id" not in str(schema) and "agent_name" not in str(schema)

            added = await call_tool(
                client, "memory_add", content="Alice drinks green tea", category="preference"
            )
            assert added["status"] == "added"
            assert _stored(cli.url, "alice") == ["Alice drinks green tea"]

            found = await call_tool(client, "memory_search", query="tea")
            assert [fact["id"] for fact in found["results"]] == [added["fact_id"]]

            await call_tool(
                client, "memory_update", fact_id=added["fact_id"], content="Alice drinks oolong tea"
            )
            assert _stored(cli.url, "alice") == ["Alice drinks oolong tea"]

            context = await call_tool(client, "memory_context", query="what does she drink?")
            assert "Alice drinks oolong tea" in context["context"]
            assert context["context"].startswith("<memory>")
            refused = await tool_error(client, "memory_context", query="q" * 2001)
            assert refused.endswith("query: 2,001 characters, the limit is 2,000")

            await call_tool(client, "memory_delete", fact_id=added["fact_id"])
            assert _stored(cli.url, "alice") == []
            assert "Fact not found" in await tool_error(client, "memory_delete", fact_id=added["fact_id"])

    asyncio.run(session())


def test_stdio_tool_errors_say_which_rule_failed_and_never_echo_the_text(cli: Cli) -> None:
    """Tool mode's message reaches the client: the field and the rule, not the text that broke it."""
    marker = "ZQX-marker-7f3a "  # distinctive: an error that echoed the submitted text would show it

    async def session() -> list[str]:
        async with _stdio_client(cli, "--user", "alice") as client:
            return [
                await tool_error(client, "memory_add", content=(marker * 200)[:3000]),
                await tool_error(client, "memory_add", content=marker + "\x00"),
            ]

    too_long, nul = asyncio.run(session())
    assert too_long.endswith("memory_add: content: 3,000 characters, the limit is 2,000"), too_long
    assert nul.endswith("memory_add: content: contains NUL (U+0000), which cannot be stored"), nul
    assert "ZQX" not in too_long + nul
    assert _stored(cli.url, "alice") == []


def test_stdio_sessions_of_two_users_are_isolated(cli: Cli) -> None:
    async def sessions() -> None:
        async with _stdio_client(cli, "--user", "alice") as alice:
            fact_id = (await call_tool(alice, "memory_add", content="Alice's PIN hint is tea"))["fact_id"]
        async with _stdio_client(cli, "--user", "bob") as bob:
            assert (await call_tool(bob, "memory_search", query="tea"))["count"] == 0
            # A tool argument cannot name another user: the scope is the server's, not the model's.
            smuggled = await bob.call_tool("memory_search", {"query": "tea", "user_id": "alice"})
            assert not smuggled.is_error and smuggled.structured_content == {"results": [], "count": 0}
            assert "Fact not found" in await tool_error(
                bob, "memory_update", fact_id=fact_id, content="hijacked"
            )
            assert "Fact not found" in await tool_error(bob, "memory_delete", fact_id=fact_id)
            assert "PIN" not in (await call_tool(bob, "memory_context", query="tea"))["context"]
            await call_tool(bob, "memory_add", content="Bob likes coffee")
        assert _stored(cli.url, "alice") == ["Alice's PIN hint is tea"]
        assert _stored(cli.url, "bob") == ["Bob likes coffee"]

    asyncio.run(sessions())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def http_server(cli: Cli, *args: str) -> Iterator[str]:
    """``memstore mcp --transport http`` on a free port; yields its /mcp URL once it answers."""
    port = _free_port()
    process = subprocess.Popen(
        [memstore_command(), "mcp", "--transport", "http", "--port", str(port), *args],
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        for _ in range(STARTUP_ATTEMPTS):
            if process.poll() is not None:
                raise AssertionError(f"memstore mcp exited: {process.communicate()}")
            try:
                # A POST that is no JSON-RPC message: answered at once (a GET would open a stream).
                httpx.post(url, content=b"{}", headers={HEADER: "probe", **ACCEPT_BOTH})
                break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("memstore mcp never answered")
        yield url
    finally:
        process.terminate()
        process.communicate(timeout=30)


@asynccontextmanager
async def http_client(url: str, user: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={HEADER: user}) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


def test_http_takes_each_callers_user_from_the_proxy_header(cli: Cli) -> None:
    alice_id = make_safe_user_id("alice@example.com")

    async def sessions(url: str) -> None:
        async with http_client(url, "alice@example.com") as alice, http_client(url, "bob") as bob:
            listed = await alice.list_tools()
            assert sorted(tool.name for tool in listed.tools) == TOOLS
            fact_id = (await call_tool(alice, "memory_add", content="Alice is allergic to peanuts"))[
                "fact_id"
            ]
            assert (await call_tool(bob, "memory_search", query="peanuts"))["count"] == 0
            assert "Fact not found" in await tool_error(bob, "memory_update", fact_id=fact_id, content="gone")
            assert "Fact not found" in await tool_error(bob, "memory_delete", fact_id=fact_id)
            await call_tool(bob, "memory_add", content="Bob is allergic to cats")
            found = await call_tool(alice, "memory_search", query="allergic")
            assert [fact["content"] for fact in found["results"]] == ["Alice is allergic to peanuts"]

    with http_server(cli, "--user-header", HEADER) as url:
        asyncio.run(sessions(url))
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        accept = {"Accept": "application/json, text/event-stream"}
        missing = httpx.post(url, json=initialize, headers=accept)
        assert missing.status_code == 401 and HEADER in missing.json()["detail"]
        twice = httpx.post(
            url, json=initialize, headers=[*accept.items(), (HEADER, "bob"), (HEADER, "alice")]
        )
        assert twice.status_code == 400 and "2 times" in twice.json()["detail"]
        # DNS rebinding: a foreign Host is refused first, before the identity is even looked at.
        rebound = httpx.post(url, json=initialize, headers={**accept, "Host": "evil.example"})
        assert rebound.status_code == 400
        assert httpx.get(url, headers={HEADER: "bob", "Host": "evil.example"}).status_code == 400
        cross_site = httpx.post(
            url, json=initialize, headers={**accept, HEADER: "bob", "Origin": "http://evil.example"}
        )
        assert cross_site.status_code == 403
        huge = {**initialize, "padding": "x" * 300_000}
        assert httpx.post(url, json=huge, headers={**accept, HEADER: "bob"}).status_code == 413

    assert _stored(cli.url, alice_id) == ["Alice is allergic to peanuts"]
    assert _stored(cli.url, "bob") == ["Bob is allergic to cats"]


def test_a_header_identity_named_default_is_not_the_fallback_user(cli: Cli) -> None:
    """``default`` is the user of calls that name none; a header that says it gets a scope of its own."""

    async def fallback() -> str:
        async with _stdio_client(cli, "--user", DEFAULT_USER_ID) as client:
            return str((await call_tool(client, "memory_add", content="Fallback note about tea"))["fact_id"])

    async def claims_default(url: str, fact_id: str) -> None:
        async with http_client(url, "default") as client:
            assert (await call_tool(client, "memory_search", query="tea"))["count"] == 0
            assert "Fallback note" not in (await call_tool(client, "memory_context", query="tea"))["context"]
            assert "Fact not found" in await tool_error(client, "memory_update", fact_id=fact_id, content="x")
            assert "Fact not found" in await tool_error(client, "memory_delete", fact_id=fact_id)
            await call_tool(client, "memory_add", content="The header user drinks coffee")

    fact_id = asyncio.run(fallback())
    with http_server(cli, "--user-header", HEADER) as url:
        asyncio.run(claims_default(url, fact_id))
    assert _stored(cli.url, DEFAULT_USER_ID) == ["Fallback note about tea"]
    assert _stored(cli.url, make_safe_user_id("default")) == ["The header user drinks coffee"]


def test_http_with_a_fixed_user_and_usage_errors(cli: Cli) -> None:
    async def session(url: str) -> None:
        async with http_client(url, "ignored") as client:
            await call_tool(client, "memory_add", content="Carol plays the cello")

    with http_server(cli, "--user", "carol") as url:
        asyncio.run(session(url))
    assert _stored(cli.url, "carol") == ["Carol plays the cello"]

    nobody = cli("mcp")
    assert nobody.returncode == 2 and "say who the caller is" in nobody.stderr
    stdio_header = cli("mcp", "--user-header", HEADER)
    assert stdio_header.returncode == 2 and "needs --transport http" in stdio_header.stderr
    bad_user = cli("mcp", "--user", "../etc")
    assert bad_user.returncode == 2 and "Invalid value for '--user'" in bad_user.stderr
    wildcard = cli("mcp", "--transport", "http", "--host", "0.0.0.0", "--user", "carol")
    assert wildcard.returncode == 2 and "--allowed-host" in wildcard.stderr
    blank_header = cli("mcp", "--transport", "http", "--user-header", " ")
    assert blank_header.returncode == 2 and "not an HTTP header name" in blank_header.stderr
    bad_agent = cli("mcp", "--user", "carol", "--agent", "../../bad agent")
    assert bad_agent.returncode == 2 and "Invalid agent_name" in bad_agent.stderr


@pytest.mark.postgres
def test_an_outage_is_a_generic_tool_error_and_a_logged_cause(pg_url: str, tmp_path: Path) -> None:
    """The client learns the store is down; where it is (host, database) stays in the server's log."""
    database = make_url(pg_url).database
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_DATABASE_URL"] = pg_url
    assert (
        subprocess.run(
            [memstore_command(), "db", "upgrade"], env=env, capture_output=True, check=False
        ).returncode
        == 0
    )
    admin = create_engine(make_url(pg_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    server_log = tmp_path / "server.log"

    async def session() -> str:
        parameters = StdioServerParameters(
            command=memstore_command(), args=["mcp", "--user", "erin"], env=env
        )
        with server_log.open("w") as errlog:
            async with Client(stdio_client(parameters, errlog=errlog)) as client:
                await call_tool(client, "memory_add", content="Erin keeps bees")
                with admin.connect() as conn:
                    conn.execute(text(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS false'))
                    conn.execute(
                        text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                        {"name": database},
                    )
                return await tool_error(client, "memory_search", query="bees")

    try:
        refused = asyncio.run(session())
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS true'))
        admin.dispose()
    assert refused.endswith(STORAGE_UNAVAILABLE_MESSAGE)
    assert str(database) not in refused and "127.0.0.1" not in refused
    logged = server_log.read_text(encoding="utf-8")
    assert "memory tool call of user erin failed, storage:" in logged and str(database) in logged


def test_stdout_of_a_stdio_server_carries_only_the_protocol(cli: Cli) -> None:
    """Anything else on stdout (a migration line, a warning) would corrupt the client's stream."""
    env = {**cli.env, "MEMSTORE_DATA_DIR": cli.env["MEMSTORE_DATA_DIR"] + "-fresh", "MEMSTORE_TYPO": "1"}
    request = (
        '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
        '"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n'
        '{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
        '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"memory_add",'
        '"arguments":{"content":"Dana rows at dawn"}}}\n'
    )
    # stdin stays open until the answers are in: at end of input the server stops, as it should.
    process = subprocess.Popen(
        [memstore_command(), "mcp", "--user", "dana", "-v"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(request)
    process.stdin.flush()
    lines = [process.stdout.readline(), process.stdout.readline()]
    rest, stderr = process.communicate(timeout=60)  # closes stdin: the server stops
    result = subprocess.CompletedProcess(process.args, process.returncode, "".join(lines) + rest, stderr)
    answers = [json.loads(line) for line in result.stdout.splitlines()]  # every line is a message
    assert [answer["id"] for answer in answers] == [1, 2], result.stdout
    assert answers[1]["result"]["structuredContent"]["status"] == "added"
    assert "MEMSTORE_TYPO" in result.stderr  # warned, but on stderr
    if cli.url.startswith("sqlite"):
        assert "migrated sqlite" in result.stderr  # the fresh file's first migration, logged by -v
