"""The MCP tests' client side: the installed ``memstore`` command and one tool call's result."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.types import CallToolResult


def memstore_command() -> str:
    """The ``memstore`` script next to this interpreter (the one the tests run)."""
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    return executable


async def call_tool(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that must succeed: its structured result."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def tool_error(client: Client, tool: str, **arguments: Any) -> str:
    """A tool call that must fail: the text of its error."""
    result: CallToolResult = await client.call_tool(tool, arguments)
    assert result.is_error and result.structured_content is None
    return " ".join(getattr(part, "text", "") for part in result.content)
