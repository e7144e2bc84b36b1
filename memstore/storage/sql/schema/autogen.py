"""Autogenerate hooks that make ``alembic check`` and new revisions right for memstore's schema.

Importing this module registers the SQLite expression-index comparator once per process
(``alembic/env.py`` is re-executed on every run, so it cannot register hooks itself).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from alembic.autogenerate import comparators
from alembic.autogenerate.api import AutogenContext
from alembic.operations import ops
from sqlalchemy import Connection, Index, Table, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex
from sqlalchemy.sql.elements import ColumnClause, ColumnElement

from memstore.storage.sql.schema.fts_schema import is_fts_object

# SQLAlchemy and Alembic warn that SQLite expression indexes cannot be reflected and skip them;
# the comparator below checks them instead, so these warnings are noise.
SKIPPED_EXPRESSION_INDEX_WARNINGS = (
    "autogenerate skipping metadata-specified expression-based index",
    "Skipped unsupported reflection of expression-based index",
)


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Render JSONB as ``postgresql.JSONB()``: Alembic's default for a ``with_variant`` JSONB is
    ``JSONB(astext_type=Text())``, which names ``Text`` without importing it."""
    if type_ == "type" and isinstance(obj, postgresql.JSONB):
        autogen_context.imports.add("from sqlalchemy.dialects import postgresql")
        return "postgresql.JSONB()"
    return False


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Leave the full-text structures to revision 0002's raw DDL: metadata cannot describe them."""
    return not is_fts_object(name)


def is_expression_index(index: Index) -> bool:
    return any(
        isinstance(expr, ColumnElement) and not isinstance(expr, ColumnClause) for expr in index.expressions
    )


@comparators.dispatch_for("table", qualifier="sqlite")
def compare_sqlite_indexes(
    autogen_context: AutogenContext,
    modify_ops: ops.ModifyTableOps,
    schema: str | None,
    table_name: str,
    conn_table: Table | None,
    metadata_table: Table | None,
) -> None:
    """Compare expression and partial indexes by the ``CREATE INDEX`` SQLite stored: it cannot reflect
    expressions, and Alembic does not compare ``WHERE`` clauses."""
    if conn_table is None or metadata_table is None:
        return  # a table only one side has: Alembic reports the whole table, indexes included
    stored = {
        name: _squeeze(sql)
        for name, sql in _connection(autogen_context).exec_driver_sql(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ?", (table_name,)
        )
    }
    for index in _sorted(metadata_table.indexes):
        if not (is_expression_index(index) or _where(index, "sqlite") is not None):
            continue
        expected = _squeeze(str(CreateIndex(index).compile(dialect=autogen_context.dialect)))
        if stored.get(index.name) != expected:
            _recreate(modify_ops, index, exists=index.name in stored)


@comparators.dispatch_for("table", qualifier="postgresql")
def compare_postgresql_index_predicates(
    autogen_context: AutogenContext,
    modify_ops: ops.ModifyTableOps,
    schema: str | None,
    table_name: str,
    conn_table: Table | None,
    metadata_table: Table | None,
) -> None:
    """Compare partial-index predicates, which Alembic ignores, with the one PostgreSQL stored.

    Both sides are compared without whitespace and parentheses, so write predicates the way
    ``pg_get_expr`` prints them (casts and all) to keep ``alembic check`` quiet."""
    if conn_table is None or metadata_table is None:
        return  # a table only one side has: Alembic reports the whole table, indexes included
    rows = _connection(autogen_context).execute(
        text(
            "SELECT i.relname, pg_get_expr(x.indpred, x.indrelid) FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
            "JOIN pg_namespace n ON n.oid = t.relnamespace "
            "WHERE t.relname = :table AND n.nspname = coalesce(:schema, current_schema())"
        ),
        {"table": table_name, "schema": schema},
    )
    stored = {name: _bare(predicate) for name, predicate in rows}
    for index in _sorted(metadata_table.indexes):
        where = _where(index, "postgresql")
        expected = _bare(None if where is None else _compile(where, autogen_context))
        if index.name in stored and stored[index.name] != expected:
            _recreate(modify_ops, index, exists=True)


def _recreate(modify_ops: ops.ModifyTableOps, index: Index, *, exists: bool) -> None:
    if exists:
        modify_ops.ops.append(ops.DropIndexOp.from_index(index))
    modify_ops.ops.append(ops.CreateIndexOp.from_index(index))


def _where(index: Index, dialect: str) -> Any:
    return index.dialect_options[dialect].get("where")


def _compile(clause: Any, autogen_context: AutogenContext) -> str:
    return str(clause.compile(dialect=autogen_context.dialect, compile_kwargs={"literal_binds": True}))


def _connection(autogen_context: AutogenContext) -> Connection:
    assert autogen_context.connection is not None, "autogenerate always compares against a connection"
    return autogen_context.connection


def _sorted(indexes: set[Index]) -> list[Index]:
    return sorted(indexes, key=lambda index: str(index.name))


def _squeeze(sql: str | None) -> str:
    return re.sub(r"\s+", " ", sql or "").strip()


def _bare(predicate: str | None) -> str:
    return re.sub(r"[\s()]", "", predicate or "").lower()
