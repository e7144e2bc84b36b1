"""The query and maintenance surface a provider may offer beyond ``load``/``save``.

It is a protocol rather than part of ``MemoryStorage`` so a custom provider stays valid with
just the three document methods; ``memstore.queries`` reports clearly when one is missing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

from memstore.scope import Scope
from memstore.storage.records import (
    FactFilter,
    FactOrder,
    FactPage,
    FactRelations,
    HistoryEntry,
    MemoryStats,
)
from memstore.storage.search_text import SearchMatch


@runtime_checkable
class StorageOperations(Protocol):
    def query_facts(
        self,
        where: FactFilter,
        *,
        search: str | None,
        limit: int,
        offset: int,
        order: FactOrder = "newest",
        match: SearchMatch = "any",
    ) -> FactPage:
        """Live facts matching ``where`` (ranked by ``search`` when given, a fact needing ``any`` or
        ``all`` of its words), one page plus the total."""

    def stats(self) -> MemoryStats: ...

    def list_scopes(self, user_id: str | None = None) -> list[Scope]:
        """Every stored scope (of ``user_id`` when given), in a stable order."""

    def history(self, where: FactFilter, *, fact_id: str | None, limit: int) -> list[HistoryEntry]:
        """The newest ``limit`` audit rows of the scopes ``where`` selects, oldest first."""

    def fact_relations(
        self, fact_id: str, agent_name: str | None = None, *, user_id: str | None = None
    ) -> FactRelations:
        """The relations from and to fact ``fact_id`` of the scope (``memstore.record.RELATION_KINDS``)."""

    def erase_user(self, user_id: str) -> dict[str, int]:
        """Remove everything stored for ``user_id``; returns what was removed, per table or kind."""

    def vacuum(self, cutoff: datetime) -> dict[str, int]:
        """Purge audit history and tombstones older than ``cutoff``; returns what was purged."""
