"""The agent's memory-document tools over MCP (issue 34): the SDK's own client against ``memstore
mcp``, on SQLite and PostgreSQL. The agent is the server's ``--agent`` and the user its ``--user``;
a version read by one server and changed through another is refused; hostile paths are refused
by every tool without touching what is stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from mcp import Client, StdioServerParameters

from memstore.agent_doc import checked_folder
from memstore.errors import AgentDocPathError
from tests.integration.conftest import Cli
from tests.support.hostile_paths import hostile_paths
from tests.support.mcp_client import call_tool, memstore_command, tool_error

FILE_TOOLS = ["memory_delete_file", "memory_edit_file", "memory_ls", "memory_read_file", "memory_write_file"]
MAIN = "/memories/agent.md"


def _client(cli: Cli, *args: str, **env: str) -> Client:
    return Client(StdioServerParameters(command=memstore_command(), args=["mcp", *args], env=cli.env | env))


async def _text(client: Client, tool: str, **arguments: Any) -> str:
    result = await call_tool(client, tool, **arguments)
    return str(result["result"])


def test_file_tools_under_the_servers_agent_and_user(cli: Cli) -> None:
    async def alice() -> str:
        async with _client(cli, "--user", "alice", "--agent", "coder") as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(FILE_TOOLS) <= set(listed)
            schemas = str([listed[name].input_schema for name in FILE_TOOLS])
            assert "user_id" not in schemas and "agent_name" not in schemas and "tenant_id" not in schemas
            write = listed["memory_write_file"].description or ""
            assert "memory_read_file reported" in write and "prefer memory_edit_file" in write

            assert await _text(client, "memory_ls") == "No memory documents under /memories/"
            wrote = await _text(client, "memory_write_file", file_path=MAIN, content="# Coder\nlikes Rust\n")
            assert wrote == "Wrote /memories/agent.md: now version 1, 19 characters"
            exists = await tool_error(client, "memory_write_file", file_path=MAIN, content="again")
            assert exists.endswith(
                "already exists (version 1): read it and pass its version to overwrite it, "
                "or use memory_edit_file"
            )
            read = await _text(client, "memory_read_file", file_path=MAIN, offset=1)
            assert read == "/memories/agent.md, version 1: lines 2-2 of 2\n     2\tlikes Rust"
            assert "limit" in await tool_error(client, "memory_read_file", file_path=MAIN, limit=0)
            assert "version" in await tool_error(
                client, "memory_edit_file", file_path=MAIN, old_string="a", new_string="b", version=True
            )
            await _text(client, "memory_write_file", file_path="/memories/projects/x.md", content="x")
            return await _text(client, "memory_ls", path="/memories/projects")

    async def bob_edits() -> None:
        async with _client(cli, "--user", "bob", "--agent", "Coder") as client:  # the agent's own: shared
            edited = await _text(
                client,
                "memory_edit_file",
                file_path=MAIN,
                old_string="Rust",
                new_string="Rust and Go",
                version=1,
            )
            assert edited == "Edited /memories/agent.md: now version 2, 26 characters"

    async def alice_is_stale() -> None:
        async with _client(cli, "--user", "alice", "--agent", "coder") as client:
            stale = await tool_error(
                client, "memory_edit_file", file_path=MAIN, old_string="likes", new_string="loves", version=1
            )
            assert "has changed since version 1 was read: it is at version 2" in stale
            gone = await tool_error(
                client, "memory_delete_file", file_path="/memories/projects/x.md", version=2
            )
            assert "has changed since version 2" in gone
            deleted = await _text(
                client, "memory_delete_file", file_path="/memories/projects/x.md", version=1
            )
            assert deleted == "Deleted /memories/projects/x.md (the delete is version 2)"
            # Arguments cannot name another agent or user: the scope is the server's.
            smuggled = await client.call_tool("memory_ls", {"agent_name": "writer", "user_id": "carol"})
            assert smuggled.structured_content == {"result": "/memories/agent.md (version 2, 26 characters)"}

    async def elsewhere() -> None:
        async with _client(cli, "--user", "alice", "--agent", "writer") as client:
            assert await _text(client, "memory_ls") == "No memory documents under /memories/"
        async with _client(cli, "--user", "alice", "--agent", "coder", "--tenant", "acme") as client:
            assert "no document at /memories/agent.md" in await tool_error(
                client, "memory_read_file", file_path=MAIN
            )

    assert asyncio.run(alice()) == "/memories/projects/x.md (version 1, 1 characters)"
    asyncio.run(bob_edits())
    asyncio.run(alice_is_stale())
    asyncio.run(elsewhere())
    history = cli.json("agent-doc", "history", "coder")["versions"]  # the operator sees who did what
    assert [(v["path"], v["version"], v["action"], v["author"], v["actor"]) for v in history] == [
        ("/memories/projects/x.md", 2, "delete", "agent", "alice"),
        ("/memories/agent.md", 2, "edit", "agent", "bob"),
        ("/memories/projects/x.md", 1, "write", "agent", "alice"),
        ("/memories/agent.md", 1, "write", "agent", "alice"),
    ]


def test_per_user_documents_and_read_only_tools(cli: Cli) -> None:
    async def run() -> None:
        per_user = {"MEMSTORE_AGENT_DOC_PER_USER": "true"}
        async with _client(cli, "--user", "alice", "--agent", "coder", **per_user) as client:
            await _text(client, "memory_write_file", file_path=MAIN, content="alice's")
        async with _client(cli, "--user", "bob", "--agent", "coder", **per_user) as client:
            assert await _text(client, "memory_ls") == "No memory documents under /memories/"
        read_only = {"MEMSTORE_AGENT_DOC_AGENT_WRITES": "false"}
        async with _client(cli, "--user", "alice", "--agent", "coder", **read_only) as client:
            refused = await tool_error(client, "memory_write_file", file_path=MAIN, content="x")
            assert "read-only here (agent_doc_agent_writes is off)" in refused
            assert "empty" not in await tool_error(client, "memory_delete_file", file_path=MAIN)

    asyncio.run(run())
    assert cli.json("agent-doc", "show", "coder", "--user", "alice")["content"] == "alice's"
    assert cli("agent-doc", "show", "coder").returncode != 0  # the agent's own: none written


@pytest.fixture
def alice_coder(cli: Cli) -> Iterator[tuple[BlockingPortal, Client]]:
    """One server for every example: the client lives on a portal's event loop, the test calls it."""
    with start_blocking_portal() as portal:
        client = _client(cli, "--user", "alice", "--agent", "coder")
        with portal.wrap_async_context_manager(client) as entered:
            portal.call(lambda: call_tool(entered, "memory_write_file", file_path=MAIN, content="kept"))
            yield portal, entered
            listing = portal.call(lambda: call_tool(entered, "memory_ls"))
            assert listing == {"result": "/memories/agent.md (version 1, 4 characters)"}
    history = cli.json("agent-doc", "history", "coder")["versions"]
    assert [(v["path"], v["version"]) for v in history] == [(MAIN, 1)]  # no hostile call stored anything


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(path=hostile_paths)
def test_every_file_tool_refuses_a_hostile_path(
    alice_coder: tuple[BlockingPortal, Client], path: str
) -> None:
    portal, client = alice_coder

    def refused(tool: str, **arguments: Any) -> str:
        result = portal.call(lambda: client.call_tool(tool, {"file_path": path, **arguments}))
        assert result.is_error, (tool, path, result.content)
        return " ".join(getattr(part, "text", "") for part in result.content)

    for tool, arguments in (
        ("memory_read_file", {}),
        ("memory_write_file", {"content": "x"}),
        ("memory_edit_file", {"old_string": "kept", "new_string": "x"}),
        ("memory_delete_file", {}),
    ):
        assert "path" in refused(tool, **arguments)
    listed = portal.call(lambda: client.call_tool("memory_ls", {"path": path}))
    try:
        checked_folder(path)  # /memories and /memories/a.md/ are folders: listing them is fine
    except AgentDocPathError:
        assert listed.is_error, (path, listed.content)
    else:
        assert not listed.is_error and listed.structured_content is not None
        assert "kept" not in str(listed.structured_content)
