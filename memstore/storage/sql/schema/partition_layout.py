"""What ``memstore db check`` must accept on the partitioned layout (``partition.py``).

Alembic compares the database with memstore's models, which describe the plain layout. On the
partitioned one it also finds what partitioning adds by construction: the partitions themselves
and their indexes, the per-partition copies PostgreSQL makes of a foreign key to or from a
partitioned table (``conparentid`` set), and the one foreign key ``db partition`` widens
(a vector references its fact by ``(id, scope_id)``). ``Layout.explains`` says which differences
are those; every other difference is still reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

WIDENED_FOREIGN_KEY = "fk_memory_fact_embeddings_fact_row_id_memory_facts"
"""The foreign key that references ``memory_facts (id, scope_id)`` on the partitioned layout."""
_PARTITIONED = text(
    "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
    "WHERE c.relname = :table AND c.relnamespace = current_schema()::regnamespace)"
)


def is_partitioned(conn: Connection, table: str = "memory_facts") -> bool:
    """Is ``table`` a partitioned table in the connection's schema (never on SQLite)?"""
    if conn.dialect.name != "postgresql":
        return False
    return bool(conn.execute(_PARTITIONED, {"table": table}).scalar_one())


@dataclass(frozen=True)
class Layout:
    partitioned: bool
    partitions: frozenset[str]
    cloned_foreign_keys: frozenset[str]

    @classmethod
    def read(cls, conn: Connection) -> Layout:
        if not is_partitioned(conn):
            return cls(False, frozenset(), frozenset())
        schema = "relnamespace = current_schema()::regnamespace"
        partitions = conn.execute(text(f"SELECT relname FROM pg_class WHERE relispartition AND {schema}"))
        clones = conn.execute(
            text(
                "SELECT c.conname FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid "
                f"WHERE c.contype = 'f' AND c.conparentid <> 0 AND t.{schema}"
            )
        )
        return cls(True, frozenset(map(str, partitions.scalars())), frozenset(map(str, clones.scalars())))

    def explains(self, diff: Any) -> bool:
        """Is this Alembic difference the partitioned layout itself rather than drift?"""
        if not self.partitioned or not isinstance(diff, tuple) or len(diff) < 2:
            return False
        kind, thing = diff[0], diff[1]
        table = getattr(getattr(thing, "table", None), "name", None)
        name = getattr(thing, "name", None)
        if kind in {"remove_table", "remove_index"}:
            return (getattr(thing, "name", None) if kind == "remove_table" else table) in self.partitions
        if kind == "remove_fk":
            return name in self.cloned_foreign_keys or name == WIDENED_FOREIGN_KEY
        return kind == "add_fk" and name == WIDENED_FOREIGN_KEY
