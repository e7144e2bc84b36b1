"""The ``<memory>`` block a user's next prompt would get, rendered for an operator to look at.

It is the gateway's render (``gateway.compose``, shared with ``MemoryMiddleware``), minus one step:
the gateway counts an access of every fact it injects, which feeds the decay score. Looking at a
user's memory must not keep it alive, so the preview reads and ranks the same way and records
nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from memstore.config import get_memory_config
from memstore.gateway.compose import compose_memory_block
from memstore.inject.relevance import MAX_QUERY_CHARS
from memstore.ops.validation import search_text
from memstore.storage.loader import get_memory_storage


@dataclass(frozen=True)
class Preview:
    block: str
    fact_ids: list[str]
    ranked_by: str

    def to_json(self) -> dict[str, Any]:
        return {"block": self.block, "fact_ids": self.fact_ids, "ranked_by": self.ranked_by}


def memory_block(
    user_id: str, agent_name: str | None, tenant_id: str, query: str | None, roles: frozenset[str]
) -> Preview:
    """What ``memory_context(user_id=..., query=...)`` would return for the user now (``roles``: the
    user's, which decide the shared facts it reads), and which facts it holds."""
    config = get_memory_config()
    if query:
        search_text("query", query, MAX_QUERY_CHARS)
    storage = get_memory_storage().for_identity(tenant_id, roles)
    deadline = time.monotonic() + config.memory_context_timeout_seconds
    composed = compose_memory_block(storage, agent_name, user_id, query or None, config, deadline=deadline)
    ordered = "relevance to the query" if query else "standing"
    return Preview(composed.block, composed.fact_ids, "confidence" if composed.scores is None else ordered)
