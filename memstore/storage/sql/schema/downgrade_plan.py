"""What a downgrade drops, worked out before it runs, so ``memstore db downgrade`` can say so and ask.

The revisions are replayed on a scratch in-memory SQLite database: up to the database's revision,
then down by the same REV. What disappears between the two is what the real downgrade removes;
each table and column is then looked up in the real database and its rows counted there. Diffing
the real database against the target instead would list what is not memstore's (a shared
PostgreSQL database holds other tables) and each dialect's own objects. Full-text objects (SQLite's
FTS5 tables) are left out: they index ``memory_facts`` and hold nothing of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from alembic import command
from alembic.runtime.migration import MigrationContext
from alembic.script.revision import RevisionError
from alembic.util import CommandError
from sqlalchemy import Connection, column, create_engine, func, inspect, select, table
from sqlalchemy.engine import URL
from sqlalchemy.pool import StaticPool

from memstore.errors import MigrationError
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.schema import migrate
from memstore.storage.sql.schema.fts_schema import is_fts_object


@dataclass(frozen=True)
class Dropped:
    """A table, a column (``table.column``) or an index that the downgrade removes.

    ``rows``: a table's rows, or the rows holding a value in a column (a NULL holds nothing);
    ``None`` for an index, which holds no data of its own.
    """

    kind: Literal["table", "column", "index"]
    name: str
    rows: int | None


@dataclass(frozen=True)
class DowngradePlan:
    current: str | None
    target: str | None
    """The revision REV resolves to (``None``: base); downgrade to it, not to REV again, so a
    relative REV cannot mean another revision by the time it runs."""
    drops: list[Dropped]

    @property
    def loses_data(self) -> bool:
        return any(drop.rows for drop in self.drops)


@dataclass(frozen=True)
class _Schema:
    tables: frozenset[str]
    columns: frozenset[tuple[str, str]]
    indexes: frozenset[tuple[str, str]]
    """``(index, table)``"""


def plan_downgrade(url: str | URL, revision: str) -> DowngradePlan:
    """What downgrading ``url`` by ``revision`` drops, with row counts; changes nothing.

    A ``revision`` the downgrade would refuse raises the same ``MigrationError`` here.
    """
    current = migrate.current(url)  # None for a missing SQLite file, which this does not create
    target, before, after = _replay(current, revision)
    gone_tables = before.tables - after.tables
    gone_columns = {(name, col) for name, col in before.columns - after.columns if name in after.tables}
    drops = [
        Dropped("index", index, None)
        for index, name in sorted(before.indexes - after.indexes)
        if name in after.tables  # a dropped table takes its indexes along
    ]
    if not gone_tables and not gone_columns:
        return DowngradePlan(current, target, drops)
    with get_engine(url).connect() as conn:
        real = inspect(conn)
        present = set(real.get_table_names())
        tables = [Dropped("table", name, _rows(conn, name)) for name in sorted(gone_tables & present)]
        columns = [
            Dropped("column", f"{name}.{col}", _rows(conn, name, col))
            for name, col in sorted(gone_columns)
            if name in present and col in {c["name"] for c in real.get_columns(name)}
        ]
    return DowngradePlan(current, target, tables + columns + drops)


def _replay(current: str | None, revision: str) -> tuple[str | None, _Schema, _Schema]:
    """The revision ``revision`` resolves to from ``current``, and the schema before and after."""
    scratch = create_engine("sqlite://", poolclass=StaticPool)
    try:
        with scratch.begin() as conn:
            config = migrate.alembic_config(connection=conn)
            if current is not None:
                command.upgrade(config, current)
            before = _schema(conn)
            command.downgrade(config, revision)
            return MigrationContext.configure(conn).get_current_revision(), before, _schema(conn)
    except (CommandError, RevisionError) as exc:
        raise MigrationError(str(exc)) from exc
    finally:
        scratch.dispose()


def _schema(conn: Connection) -> _Schema:
    objects = [
        (kind, name, owner)
        for kind, name, owner in conn.exec_driver_sql(
            "SELECT type, name, tbl_name FROM sqlite_master "
            "WHERE type IN ('table', 'index') AND sql IS NOT NULL AND name NOT LIKE 'sqlite%'"
        )
        if not is_fts_object(owner)
    ]
    tables = frozenset(name for kind, name, _owner in objects if kind == "table")
    return _Schema(
        tables=tables,
        columns=frozenset(
            (name, info[1])
            for name in tables
            for info in conn.exec_driver_sql(f'PRAGMA table_info("{name}")')
        ),
        indexes=frozenset((name, owner) for kind, name, owner in objects if kind == "index"),
    )


def _rows(conn: Connection, name: str, col: str | None = None) -> int:
    counted = func.count() if col is None else func.count(column(col))
    return int(conn.execute(select(counted).select_from(table(name))).scalar_one())
