"""``memstore.queries`` on the async face: the same questions, awaited (see ``memstore.aio``).

from memstore.aio import queries
page = await queries.list_facts(queries.FactFilter(user_id="alice"), limit=50)
"""

from memstore.async_face import on_loop
from memstore.errors import QueryError
from memstore.ops import queries
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

list_facts = on_loop(queries.list_facts)
search_facts = on_loop(queries.search_facts)
count_facts = on_loop(queries.count_facts)
list_scopes = on_loop(queries.list_scopes)
memory_history = on_loop(queries.memory_history)
fact_relations = on_loop(queries.fact_relations)
memory_stats = on_loop(queries.memory_stats)
erase_user = on_loop(queries.erase_user)
vacuum = on_loop(queries.vacuum)
vacuum_counts = on_loop(queries.vacuum_counts)

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
    "search_facts",
    "vacuum",
    "vacuum_counts",
]
