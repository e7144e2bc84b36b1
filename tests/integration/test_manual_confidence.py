"""A manual fact's default confidence is one value on every path (issue 30, item 16).

Before, ``POST /api/memory/facts`` and the helpers stored 0.50, below the 0.7 extraction threshold,
while tool mode and MCP's ``memory_add`` stored 0.70: the same sentence ranked differently by the
route it took.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from mcp import Client

from memstore.config import MemoryConfig
from memstore.document import MANUAL_CONFIDENCE
from memstore.gateway.tools import memory_add
from memstore.integrations.mcp import create_mcp_server, fixed_identity
from memstore.ops.facts import create_memory_fact, get_memory_data
from tests.integration.test_fastapi_router import ALICE, build_client


def _confidence(user_id: str) -> float:
    [fact] = get_memory_data(user_id=user_id)["facts"]
    return float(fact["confidence"])


def test_every_manual_path_stores_the_same_default(sql_url: str, tmp_path: Path) -> None:
    assert MANUAL_CONFIDENCE == MemoryConfig().fact_confidence_threshold == 0.7

    with build_client(sql_url, tmp_path) as client:
        response = client.post("/api/memory/facts", json={"content": "Alice likes tea"}, headers=ALICE)
        assert response.status_code == 200, response.text

        create_memory_fact("Bob likes tea", user_id="bob")
        memory_add("Carol likes tea", user_id="carol")

        async def over_mcp() -> None:
            async with Client(create_mcp_server(fixed_identity("dave"))) as mcp:
                result = await mcp.call_tool("memory_add", {"content": "Dave likes tea"})
                assert not result.is_error, result.content

        asyncio.run(over_mcp())

        assert {user: _confidence(user) for user in ("alice", "bob", "carol", "dave")} == dict.fromkeys(
            ("alice", "bob", "carol", "dave"), MANUAL_CONFIDENCE
        )
