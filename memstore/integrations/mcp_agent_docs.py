"""The agent's memory-document file tools on the MCP server: ``memory_ls``, ``memory_read_file``,
``memory_write_file``, ``memory_edit_file`` and ``memory_delete_file``.

Each wraps the file tool of the same name without the prefix (``gateway.agent_doc_tools``), which
does the work and the wording. The prefix keeps them apart from a file-system server's
``read_file`` or ``write_file`` in the same client, where the model would otherwise see two tools
of one name; the tools' descriptions and errors use the prefixed names too. The agent is the
server's ``--agent`` and the user and tenant the server's identity, never arguments, so a model
cannot reach another agent's or user's documents. ``version`` is the version the model read:
a write with it is refused if the document has changed since.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from inspect import getdoc
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from memstore.agent_doc import DOC_ROOT, LARGEST_DOC_CHARS, MAX_PATH_CHARS
from memstore.gateway import agent_doc_tools
from memstore.scope import Identity

PREFIX = "memory_"
Version = Annotated[int, Field(strict=True, ge=1)]
FilePath = Annotated[str, Field(max_length=MAX_PATH_CHARS)]
Text = Annotated[str, Field(max_length=LARGEST_DOC_CHARS)]
"""A document's text or a piece of it; ``agent_doc_max_chars`` is checked after (over HTTP the
transport's body cap, ``MAX_MCP_BODY_BYTES``, comes first)."""
Offset = Annotated[int, Field(strict=True, ge=0)]
Lines = Annotated[int, Field(strict=True, ge=1, le=agent_doc_tools.MAX_READ_LINES)]
_TOOL_NAME = re.compile(
    r"(?<![\w/.-])(" + "|".join(tool.__name__ for tool in agent_doc_tools.FILE_TOOLS) + r")(?![\w/.-])"
)
"""A tool's name as a word of its own, never a name inside a path (``/memories/ls``, ``ls.md``)."""


def prefixed(text: str) -> str:
    """``text`` (a description or an error, never a document) naming the tools as this server does."""
    return _TOOL_NAME.sub(lambda match: PREFIX + match.group(1), text)


def _answer(text: str) -> str:
    if text.startswith("Error: "):
        raise ToolError(prefixed(text.removeprefix("Error: ")))
    return text


def add_agent_doc_tools(
    server: MCPServer, identity: Callable[[Context], Identity], agent_name: str | None
) -> None:
    """Register the file tools on ``server``, over ``agent_name``'s documents for ``identity``'s user."""

    def scope(ctx: Context) -> dict[str, Any]:
        caller = identity(ctx)
        return {"agent_name": agent_name, "user_id": caller.user_id, "tenant_id": caller.tenant_id}

    def ls(ctx: Context, path: FilePath = DOC_ROOT) -> str:
        return _answer(agent_doc_tools.ls(path, **scope(ctx)))

    def read_file(
        file_path: FilePath, ctx: Context, offset: Offset = 0, limit: Lines = agent_doc_tools.MAX_READ_LINES
    ) -> str:
        return _answer(agent_doc_tools.read_file(file_path, offset, limit, **scope(ctx)))

    def write_file(file_path: FilePath, content: Text, ctx: Context, version: Version | None = None) -> str:
        return _answer(agent_doc_tools.write_file(file_path, content, version, **scope(ctx)))

    def edit_file(
        file_path: FilePath, old_string: Text, new_string: Text, ctx: Context, version: Version | None = None
    ) -> str:
        return _answer(agent_doc_tools.edit_file(file_path, old_string, new_string, version, **scope(ctx)))

    def delete_file(file_path: FilePath, ctx: Context, version: Version | None = None) -> str:
        return _answer(agent_doc_tools.delete_file(file_path, version, **scope(ctx)))

    wrappers = {tool.__name__: tool for tool in (ls, read_file, write_file, edit_file, delete_file)}
    for shared in agent_doc_tools.FILE_TOOLS:
        server.add_tool(
            wrappers[shared.__name__],
            name=PREFIX + shared.__name__,
            description=prefixed(getdoc(shared) or ""),
        )
