"""The cold load: one statement, one round trip, for the scope row and its document.

While the scope's derived snapshot row (``memory_scope_snapshots``, written by each save: see
``stored.py``) is at the scope's revision, the statement returns its text and the load parses it
once: no fact row is read. Otherwise (no save has written one since, or another writer moved the
revision) the same statement builds the facts and sections as JSON from the rows, each of the two
arrays parsed once by orjson, and facts are built straight from the parsed columns, without a row
object, a type processor or a ``FactValues`` per fact. Both dialects send timestamps as
``'YYYY-MM-DD HH:MM:SS.ffffff'`` UTC text (what SQLAlchemy writes on SQLite) and confidences
exactly (below). A fact with ``extra`` or a stamp in any other shape is decoded by the codec, so
the document is exactly what ``codec.decode_fact`` makes of the row
(``tests/integration/test_cold_load_equivalence.py``).

The statement runs on the driver's cursor (``driver.driver_rows``): SQLAlchemy's own execution
cost more than SQLite running it. On SQLite it needs no transaction around it (one statement reads
one snapshot), except in the rare case below.

The save fast path needs the rows as a ``Snapshot``; the entry builds it only when a save asks
(``CacheEntry.snapshot``), since most loads are reads.
"""

from __future__ import annotations

import json
import re
import struct
from datetime import datetime
from functools import partial
from typing import Any

import orjson
from sqlalchemy import Connection

from memstore.document import HISTORY_SECTIONS, USER_SECTIONS, MemoryDocument, as_utc, format_timestamp
from memstore.record import (
    DEFAULT_IMPORTANCE,
    DEFAULT_SOURCE_KIND,
    FALLBACK_TYPE,
    TYPE_OF_CATEGORY,
    default_type,
)
from memstore.storage.sql.documents.cache import CacheEntry, Stamp, body_text, incarnation
from memstore.storage.sql.documents.codec import (
    EMPTY_SECTION,
    INCARNATION_KEY,
    FactValues,
    Record,
    SectionValues,
    decode_fact,
    decode_section,
)
from memstore.storage.sql.documents.grants import PRIVATE, parse_grants
from memstore.storage.sql.documents.json_values import json_object
from memstore.storage.sql.documents.snapshot import Snapshot, snapshot_of
from memstore.storage.sql.documents.statements import scope_time
from memstore.storage.sql.documents.stored import SNAPSHOT_JOIN, snapshot_from_text
from memstore.storage.sql.driver import driver_rows

# A confidence travels as the integer confidence * 2**60, exact whenever it is an integer (every
# value from 1/256 up, and most below). Decimal text would not be exact: SQLite's JSON and printf
# keep 15 to 17 digits, not every bit. Otherwise PostgreSQL sends the float's 8 bytes in hex, and
# SQLite null: ``read_entry`` then reads those few confidences in the same transaction.
_SCALE = 2**60
_SCALED = f"f.confidence * CAST({_SCALE} AS DOUBLE PRECISION)"
_EXACT = f"{_SCALED} = CAST({_SCALED} AS BIGINT)"
_FACT_ITEM = (
    "f.position, f.fact_id, f.content, f.category, {confidence}, {created_at}, f.source, f.source_error"
)
_SCOPE = (
    "s.id AS scope_id, s.revision, s.version, s.created_at AS scope_created_at, "
    "s.updated_at AS scope_updated_at"
)
_WHERE = (
    "s.tenant_id = :tenant_key AND coalesce(s.user_id, '') = :user_key "
    "AND coalesce(s.agent_name, '') = :agent_key"
)
# A shared fact's grants as ``kind:name,kind:name`` (``grants.parse_grants``); NULL for the others.
_GRANTS = (
    "CASE WHEN f.visibility = 'shared' THEN (SELECT {aggregate}(g.grantee_kind || ':' || g.grantee, ',') "
    "FROM memory_fact_grants g WHERE g.scope_id = f.scope_id AND g.fact_row_id = f.id) END"
)
_LIVE = "FROM memory_facts f WHERE f.scope_id = s.id AND f.deleted_revision IS NULL"
# The record columns (``record_values.Record``) as one array, NULL when all hold their defaults
# (nearly every fact); tags and relations come once per scope (``_LINKS``), not once per fact.
# The record's defaults (``memstore.record``), spelled once here as SQL literals.
_TYPE_OF_CATEGORY = (
    "CASE f.category "
    + " ".join(f"WHEN '{category}' THEN '{kind}'" for category, kind in TYPE_OF_CATEGORY.items())
    + f" ELSE '{FALLBACK_TYPE}' END"
)
_RECORD = (
    f"CASE WHEN f.importance <> {DEFAULT_IMPORTANCE} OR f.source_kind <> '{DEFAULT_SOURCE_KIND}' "
    f"OR f.raw IS NOT NULL OR f.structured IS NOT NULL OR f.memory_type <> {_TYPE_OF_CATEGORY} "
    "THEN {pair}(f.memory_type, f.importance, f.source_kind, f.raw, {structured}) END"
)
_LINKS = (
    "(SELECT {aggregate}({pair}(g.fact_id, t.tag)) FROM memory_fact_tags t "
    "JOIN memory_facts g ON g.scope_id = t.scope_id AND g.id = t.fact_row_id "
    "WHERE t.scope_id = s.id){cast}",
    "(SELECT {aggregate}({pair}(r.fact_id, r.kind, r.target_fact_id)) FROM memory_fact_relations r "
    "WHERE r.scope_id = s.id){cast}",
)
_SQLITE_RECORD = _RECORD.format(structured="f.structured", pair="json_array")
_PG_RECORD = _RECORD.format(structured="f.structured::text", pair="json_build_array")
_SQLITE_LINKS = [part.format(aggregate="json_group_array", pair="json_array", cast="") for part in _LINKS]
_PG_LINKS = [part.format(aggregate="json_agg", pair="json_build_array", cast="::text") for part in _LINKS]
_SQLITE_ITEM = _FACT_ITEM.format(
    confidence=f"CASE WHEN {_EXACT} THEN CAST({_SCALED} AS BIGINT) END", created_at="f.created_at"
)
_SQLITE_GRANTS = _GRANTS.format(aggregate="group_concat")
_PG_GRANTS = _GRANTS.format(aggregate="string_agg")
_PG_STAMP = "to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
_PG_ITEM = _FACT_ITEM.format(
    # Zero goes as bytes too: -0.0 scales to the integer 0 and would come back as 0.0.
    confidence=f"CASE WHEN f.confidence <> 0 AND {_EXACT} THEN CAST({_SCALED} AS BIGINT)::text::json "
    "ELSE to_json(encode(float8send(f.confidence), 'hex')) END",
    created_at=_PG_STAMP.format("f.created_at"),
)
_PG_SECTION = f"c.section, c.summary, {_PG_STAMP.format('c.updated_at')}, c.extra::text"
_ROWS = {
    "sqlite": (
        f"(SELECT json_group_array(json_array({_SQLITE_ITEM}, f.extra, f.visibility, {_SQLITE_GRANTS}, "
        f"{_SQLITE_RECORD})) {_LIVE})",
        "(SELECT json_group_array(json_array(c.section, c.summary, c.updated_at, c.extra)) "
        "FROM memory_sections c WHERE c.scope_id = s.id)",
        *_SQLITE_LINKS,
    ),
    "postgresql": (
        f"(SELECT json_agg(json_build_array({_PG_ITEM}, f.extra::text, f.visibility, {_PG_GRANTS}, "
        f"{_PG_RECORD}))::text {_LIVE})",
        f"(SELECT json_agg(json_build_array({_PG_SECTION}))::text "
        "FROM memory_sections c WHERE c.scope_id = s.id)",
        *_PG_LINKS,
    ),
}
"""Per dialect, the facts, sections, tags and relations as JSON arrays built from the rows."""


def _load_statement(dialect: str) -> str:
    # A CASE arm's subquery runs only when reached: with a current snapshot, no fact row is read.
    rows = ", ".join(f"CASE WHEN d.scope_id IS NULL THEN {part} END" for part in _ROWS[dialect])
    sql = f"SELECT {_SCOPE}, d.document, d.layout, {rows} FROM memory_scopes s {SNAPSHOT_JOIN} WHERE {_WHERE}"
    if dialect == "postgresql":  # psycopg's named parameters
        return re.sub(r"(?<!:):(tenant_key|user_key|agent_key)\b", r"%(\1)s", sql)
    return sql


LOAD_STATEMENTS = {dialect: _load_statement(dialect) for dialect in _ROWS}
"""The cold load per dialect, bound by ``statements.scope_keys``; no row means nothing is stored.
Its columns: the scope's id, revision, version, created_at, updated_at; the snapshot's document
and layout (NULL unless current); the facts, sections, tags and relations (NULL when it is)."""


_EXACT_CONFIDENCES = (
    "SELECT fact_id, confidence FROM memory_facts WHERE scope_id = :scope_id AND deleted_revision IS NULL"
)
"""SQLite's exact confidences, for the few facts its JSON cannot carry exactly (above)."""

_NONE: tuple[object, ...] = (None, "[]", [])
"""An empty aggregate: PostgreSQL's ``json_agg`` gives NULL, SQLite's ``json_group_array`` ``[]``."""


def _json_list(value: object) -> list[Any]:
    """An aggregate as a list: JSON text from PostgreSQL, already an array in SQLite's JSON."""
    if value in _NONE:
        return []
    parsed = orjson.loads(value) if isinstance(value, str) else value
    return list(parsed) if isinstance(parsed, list) else []


def _timestamp(value: str | None) -> datetime | None:
    return as_utc(datetime.fromisoformat(value)) if value is not None else None


def _document_stamp(value: str) -> str:
    """``format_timestamp`` of a stored stamp, by slicing when it has the shape both dialects send."""
    parsed = datetime.fromisoformat(value)  # an impossible date fails here, as it would in the codec
    shaped = len(value) == 26 and value[4] == value[7] == "-" and value[13] == value[16] == ":"
    if not shaped or value[19] != "." or parsed.tzinfo is not None:  # e.g. a week date: 2026-W01-4...
        return format_timestamp(as_utc(parsed))
    # 'YYYY-MM-DD?HH:MM:SS.ffffff' (naive: UTC); isoformat leaves out zero microseconds.
    return f"{value[:10]}T{value[11:19] if value.endswith('.000000') else value[11:]}Z"


def _extra(value: object) -> dict[str, Any]:
    """An ``extra`` column: JSON text, or on SQLite a number a DBA wrote (numeric affinity): ``{}``."""
    if not isinstance(value, str):
        return json_object(value)
    # json, not orjson: an unknown key may hold an integer beyond 64 bits, which orjson refuses.
    return {} if value == "{}" else json_object(json.loads(value))


def _record(item: list[Any]) -> Record | None:
    """The item's record (``_attach_links`` appended its tags and relations), or None if all defaults."""
    columns = item[11]
    linked = len(item) > 12
    if columns is None and not linked:
        return None
    memory_type, importance, source_kind, raw, structured = (
        columns
        if columns is not None
        else (default_type(item[3]), DEFAULT_IMPORTANCE, DEFAULT_SOURCE_KIND, None, None)
    )
    record = Record(
        memory_type,
        importance,
        source_kind,
        raw,
        None if structured is None else _extra(structured),
        item[12] if linked else (),
        item[13] if linked else (),
    )
    return None if record.is_default_for(item[3]) else record


def _attach_links(items: list[list[Any]], tags: object, relations: object) -> None:
    """Append ``(tags, relations)`` to the items of the facts that have any, both sorted."""
    by_fact: dict[str, tuple[list[str], list[tuple[str, str]]]] = {}
    for fact_id, tag in _json_list(tags):
        by_fact.setdefault(fact_id, ([], []))[0].append(tag)
    for fact_id, kind, target in _json_list(relations):
        by_fact.setdefault(fact_id, ([], []))[1].append((kind, target))
    if not by_fact:
        return
    for item in items:
        found = by_fact.get(item[1])
        if found is not None:
            item.extend((tuple(sorted(found[0])), tuple(sorted(found[1]))))


def _fact_values(item: list[Any]) -> FactValues:
    _, fact_id, content, category, confidence, created_at, source, source_error, extra, visibility, grants = (
        item[:11]
    )
    return FactValues(
        fact_id,
        content,
        category,
        confidence,
        _timestamp(created_at),
        source,
        source_error,
        _extra(extra),
        visibility,
        parse_grants(grants),
        _record(item),
    )


def _document_fact(item: list[Any]) -> dict[str, Any]:
    """``codec.decode_fact`` of the item, without building its ``FactValues`` when it has no ``extra``."""
    _, fact_id, content, category, confidence, created_at, source, source_error, extra, visibility = item[:10]
    if extra != "{}" or visibility != PRIVATE or item[11] is not None or len(item) > 12:
        return decode_fact(_fact_values(item))
    fact = {"id": fact_id, "content": content, "category": category, "confidence": confidence}
    if created_at is not None:
        fact["createdAt"] = _document_stamp(created_at)
    if source is not None:
        fact["source"] = source
    if source_error is not None:
        fact["sourceError"] = source_error
    return fact


def read_entry(conn: Connection, keys: dict[str, str]) -> CacheEntry | None:
    """The cache entry of the scope ``keys`` names, or None; the snapshot is left to the first save."""
    row = _first(conn, LOAD_STATEMENTS[conn.dialect.name], keys)
    if row is None:
        return None
    if row[5] is not None:
        return _from_snapshot(row)
    items = _items(row)
    if _decode_confidences(items):
        # SQLite sent some confidences without their exact value: read them with the rows again,
        # in one transaction, so both statements see the same state.
        if conn.in_transaction():
            return _read_exactly(conn, keys)
        _first(conn, "BEGIN", {})
        try:
            return _read_exactly(conn, keys)
        finally:
            _first(conn, "COMMIT", {})
    return _from_rows(row, items)


def _read_exactly(conn: Connection, keys: dict[str, str]) -> CacheEntry | None:
    row = _first(conn, LOAD_STATEMENTS[conn.dialect.name], keys)
    if row is None or row[5] is not None:
        return None if row is None else _from_snapshot(row)
    items = _items(row)
    unsent = _decode_confidences(items)
    exact: dict[str, float] = dict(driver_rows(conn, _EXACT_CONFIDENCES, {"scope_id": row[0]}))
    for item in unsent:
        item[4] = exact[item[1]]
    return _from_rows(row, items)


def _first(conn: Connection, statement: str, parameters: dict[str, Any]) -> tuple[Any, ...] | None:
    rows = driver_rows(conn, statement, parameters)
    return tuple(rows[0]) if rows else None


def _stamp_and_head(row: tuple[Any, ...]) -> tuple[Stamp, tuple[str, str]]:
    scope_id, revision, version, created_at, updated_at = row[:5]
    return (scope_id, revision, scope_time(created_at)), (version, format_timestamp(scope_time(updated_at)))


def _from_snapshot(row: tuple[Any, ...]) -> CacheEntry:
    """The entry of a scope whose snapshot row is current: its text, parsed once for the caller."""
    entry_stamp, head = _stamp_and_head(row)
    text, layout = row[5], row[6]
    first: MemoryDocument = {
        "version": head[0],
        "lastUpdated": head[1],
        "revision": entry_stamp[1],
        INCARNATION_KEY: incarnation(entry_stamp),
        **orjson.loads(text),
    }
    return CacheEntry(
        entry_stamp, head, text, exact=True, build=partial(snapshot_from_text, text, layout), first=first
    )


def _items(row: tuple[Any, ...]) -> list[list[Any]]:
    items: list[list[Any]] = orjson.loads(row[7]) if row[7] is not None else []
    items.sort(key=lambda item: (item[0], item[1]))  # (scope_id, fact_id) is unique: no ties
    _attach_links(items, row[9], row[10])
    return items


def _from_rows(row: tuple[Any, ...], items: list[list[Any]]) -> CacheEntry:
    """The entry of a scope read from its rows (confidences already decoded)."""
    section_rows = orjson.loads(row[8]) if row[8] is not None else []
    sections = {
        name: SectionValues(summary, _timestamp(updated_at), _extra(extra))
        for name, summary, updated_at, extra in section_rows
    }
    entry_stamp, head = _stamp_and_head(row)

    def group(names: tuple[str, ...]) -> dict[str, Any]:
        return {name: decode_section(sections.get(name, EMPTY_SECTION)) for name in names}

    document: MemoryDocument = {
        "version": head[0],
        "lastUpdated": head[1],
        "revision": entry_stamp[1],
        INCARNATION_KEY: incarnation(entry_stamp),
        "user": group(USER_SECTIONS),
        "history": group(HISTORY_SECTIONS),
        "facts": list(map(_document_fact, items)),
    }
    body, exact = body_text(document)
    return CacheEntry(
        entry_stamp, head, body, exact=exact, build=partial(_snapshot, items, sections), first=document
    )


def _decode_confidences(items: list[list[Any]]) -> list[list[Any]]:
    """Each item's confidence as a float, in place; returns the items SQLite sent without one."""
    unsent = []
    for item in items:
        confidence = item[4]
        if type(confidence) is int:
            item[4] = confidence / _SCALE  # exact: a power of two
        elif confidence is None:
            unsent.append(item)
        else:
            item[4] = struct.unpack(">d", bytes.fromhex(confidence))[0]
    return unsent


def _snapshot(items: list[list[Any]], sections: dict[str, SectionValues]) -> Snapshot:
    return snapshot_of(list(map(_fact_values, items)), [item[0] for item in items], sections)
