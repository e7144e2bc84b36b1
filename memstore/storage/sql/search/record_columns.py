"""The memory-record columns (``memstore.record``) as the cross-scope reads select them.

A fact's tags live in ``memory_fact_tags``; reads take them as one comma-separated text from a
subquery correlated to the fact row (a tag never holds a comma: ``record.checked_tag``), so every
query that selects facts selects their tags in the same statement, on both dialects.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.schema.models import tags_table as _tags


class _TagList(FunctionElement[str]):
    """``group_concat`` on SQLite, ``string_agg`` on PostgreSQL: the tags as one text."""

    type = String()
    inherit_cache = True


@compiles(_TagList, "sqlite")
def _sqlite_tag_list(element: _TagList, compiler: SQLCompiler, **kw: Any) -> str:
    return f"group_concat({compiler.process(element.clauses, **kw)}, ',')"


@compiles(_TagList, "postgresql")
def _pg_tag_list(element: _TagList, compiler: SQLCompiler, **kw: Any) -> str:
    return f"string_agg({compiler.process(element.clauses, **kw)}, ',')"


TAG_LIST = (
    select(_TagList(_tags.c.tag))
    .where(_tags.c.scope_id == _facts.c.scope_id, _tags.c.fact_row_id == _facts.c.id)
    .scalar_subquery()
)
"""The fact row's tags, comma-separated, or NULL without any (``tags_of`` reads it)."""

RECORD_FIELD_COLUMNS = (
    _facts.c.memory_type,
    _facts.c.importance,
    _facts.c.source_kind,
    _facts.c.raw,
    _facts.c.structured,
    _facts.c.version,
    TAG_LIST.label("tags"),
)


def tags_of(joined: str | None) -> tuple[str, ...]:
    """The tags ``TAG_LIST`` selected, sorted (the table keeps no order)."""
    return tuple(sorted(joined.split(","))) if joined else ()
