"""A consolidated fact inherits its sources' retention signals, in the save that merges them.

A merge must not make well-used knowledge look unused to the cap or to expiry: the merged fact
takes the latest confirmation and access of its sources and the sum of their accesses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection

from memstore.retention import FactSignals
from memstore.scope import Scope
from memstore.storage.sql.documents import access
from memstore.storage.sql.documents.statements import SET_SIGNALS


def inherited_signals(
    conn: Connection, tenant_id: str, scope: Scope, removals: Mapping[str, Mapping[str, Any]]
) -> dict[str, FactSignals]:
    """The signals each merged fact takes over from the sources ``removals`` says it replaced.

    Latest confirmation and access, and the sum of the accesses: a merge must not make well-used
    knowledge look unused to the cap or to expiry. Read before the save, while the sources live.
    """
    sources: dict[str, list[str]] = {}
    for fact_id, detail in removals.items():
        into = detail.get("into")
        if detail.get("reason") == "consolidated" and isinstance(into, str):
            sources.setdefault(into, []).append(fact_id)
    if not sources:
        return {}
    live = access.fact_signals(conn, tenant_id, scope)
    merged: dict[str, FactSignals] = {}
    for into, ids in sources.items():
        found = [live[fact_id] for fact_id in ids if fact_id in live]
        confirmed = [signal.last_confirmed_at for signal in found if signal.last_confirmed_at]
        accessed = [signal.last_accessed_at for signal in found if signal.last_accessed_at]
        merged[into] = FactSignals(
            max(confirmed, default=None),
            max(accessed, default=None),
            sum(signal.access_count for signal in found),
        )
    return merged


def inherit_signals(conn: Connection, scope_id: int, inherited: Mapping[str, FactSignals]) -> None:
    """Write the inherited signals onto the merged facts the save inserted (no revision, no audit)."""
    if inherited:
        conn.execute(
            SET_SIGNALS,
            [
                {
                    "b_scope_id": scope_id,
                    "b_fact_id": fact_id,
                    "b_confirmed": signal.last_confirmed_at,
                    "b_accessed": signal.last_accessed_at,
                    "b_count": signal.access_count,
                }
                for fact_id, signal in inherited.items()
            ],
        )
