"""The public query API (``memstore.queries``): cross-scope questions and maintenance from Python.

The implementation lives in ``memstore.ops.queries``; this module is the documented import path.

    from memstore.queries import FactFilter, list_facts, search_facts
    page = list_facts(FactFilter(category="preference", min_confidence=0.8), limit=50)
    hits = search_facts("deer-flow", FactFilter(user_id="alice"))
"""

from memstore.errors import QueryError
from memstore.ops.queries import (
    count_facts,
    erase_user,
    fact_relations,
    list_facts,
    list_scopes,
    memory_history,
    memory_stats,
    operations_of,
    search_facts,
    vacuum,
    vacuum_counts,
)
from memstore.storage.records import (
    ANY_AGENT,
    FactFilter,
    FactPage,
    FactRecord,
    FactRelations,
    HistoryEntry,
    MemoryStats,
    Relation,
)

__all__ = [
    "ANY_AGENT",
    "FactFilter",
    "FactPage",
    "FactRecord",
    "FactRelations",
    "HistoryEntry",
    "MemoryStats",
    "QueryError",
    "Relation",
    "count_facts",
    "erase_user",
    "fact_relations",
    "list_facts",
    "list_scopes",
    "memory_history",
    "memory_stats",
    "operations_of",
    "search_facts",
    "vacuum",
    "vacuum_counts",
]
