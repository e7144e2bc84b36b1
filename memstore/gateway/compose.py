"""One user's ``<memory>`` block as the next prompt gets it: load, rank, render.

The gateway's injection and the console's preview share this, so what an operator is shown is
what the model would be given; only the gateway then counts an access of the facts it injected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memstore.config import MemoryConfig
from memstore.gateway.ranking import injection_scores
from memstore.inject.render import render_memory, wrap_memory_block
from memstore.scope import resolve_scope
from memstore.storage.base import MemoryStorage


@dataclass(frozen=True)
class ComposedBlock:
    block: str
    """The wrapped ``<memory>`` block (empty when there is nothing to inject)."""
    fact_ids: list[str]
    """The ids of the user's own facts the block shows."""
    scores: list[float] | None
    """The ranking's scores, or ``None`` for the plain confidence order."""


def compose_memory_block(
    storage: MemoryStorage,
    agent_name: str | None,
    user_id: str | None,
    query: str | None,
    config: MemoryConfig,
    *,
    deadline: float | None = None,
) -> ComposedBlock:
    """The block for ``user_id`` read through ``storage`` (a handle bound to the reader's identity),
    ranked for ``query`` when there is one; ``deadline`` as for ``injection_scores``."""
    memory = storage.load(agent_name, user_id=user_id)
    others = visible_facts(storage, agent_name, user_id)
    scope = resolve_scope(agent_name, user_id)
    scores = injection_scores(memory, query, config, storage, scope, others, deadline=deadline)
    text, fact_ids = render_memory(
        memory,
        config.max_injection_tokens,
        guaranteed_categories=tuple(config.guaranteed_categories),
        guaranteed_token_budget=config.guaranteed_token_budget,
        use_tiktoken=config.token_counting == "tiktoken",
        scores=scores,
        others=others,
        dated=config.injection_fact_dates,
    )
    return ComposedBlock(wrap_memory_block(text), fact_ids, scores)


def visible_facts(
    storage: MemoryStorage, agent_name: str | None, user_id: str | None
) -> list[dict[str, Any]]:
    """Other owners' facts the handle's identity may read; none on a provider without sharing."""
    visible = getattr(storage, "visible_facts", None)
    if visible is None or user_id is None:
        return []
    facts: list[dict[str, Any]] = visible(agent_name, user_id=user_id)
    return facts
