"""The cold load: one statement that returns the scope row with its facts and sections as JSON.

Each of the two JSON arrays is parsed once by orjson, and facts are built straight from the
parsed columns, without a row object, a type processor or a ``FactValues`` per fact: those were
most of a cold load. Both dialects send timestamps as ``'YYYY-MM-DD HH:MM:SS.ffffff'`` UTC text
(what SQLAlchemy writes on SQLite) and confidences exactly (below). A fact with ``extra`` or a
stamp in any other shape is decoded by the codec, so the document is exactly what
``codec.decode_fact`` makes of the row (``tests/integration/test_cold_load_equivalence.py``).

The save fast path needs the rows as a ``Snapshot``; the entry builds it only when a save asks
(``CacheEntry.snapshot``), since most loads are reads.
"""

from __future__ import annotations

import json
import struct
from datetime import datetime
from functools import partial
from typing import Any

import orjson
from sqlalchemy import Connection, TextualSelect, column, text

from memstore.document import HISTORY_SECTIONS, USER_SECTIONS, MemoryDocument, as_utc, format_timestamp
from memstore.record import (
    DEFAULT_IMPORTANCE,
    DEFAULT_SOURCE_KIND,
    FALLBACK_TYPE,
    TYPE_OF_CATEGORY,
    default_type,
)
from memstore.storage.sql.documents.cache import CacheEntry, incarnation, stamp_of
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
from memstore.storage.sql.schema.models import Timestamp

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
    "WHERE t.scope_id = s.id){cast} AS tags, "
    "(SELECT {aggregate}({pair}(r.fact_id, r.kind, r.target_fact_id)) FROM memory_fact_relations r "
    "WHERE r.scope_id = s.id){cast} AS relations"
)
_SQLITE_RECORD = _RECORD.format(structured="f.structured", pair="json_array")
_PG_RECORD = _RECORD.format(structured="f.structured::text", pair="json_build_array")
_SQLITE_LINKS = _LINKS.format(aggregate="json_group_array", pair="json_array", cast="")
_PG_LINKS = _LINKS.format(aggregate="json_agg", pair="json_build_array", cast="::text")
_SQLITE_ITEM = _FACT_ITEM.format(
    confidence=f"CASE WHEN {_EXACT} THEN CAST({_SCALED} AS BIGINT) END", created_at="f.created_at"
)
_SQLITE_GRANTS = _GRANTS.format(aggregate="group_concat")
_PG_GRANTS = _GRANTS.format(aggregate="string_agg")
_SQLITE_LOAD = f"""
SELECT {_SCOPE},
  (SELECT json_group_array(json_array({_SQLITE_ITEM}, f.extra, f.visibility, {_SQLITE_GRANTS},
     {_SQLITE_RECORD})) {_LIVE}) AS facts,
  (SELECT json_group_array(json_array(c.section, c.summary, c.updated_at, c.extra))
     FROM memory_sections c WHERE c.scope_id = s.id) AS sections,
  {_SQLITE_LINKS}
FROM memory_scopes s WHERE {_WHERE}
"""
_PG_STAMP = "to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')"
_PG_ITEM = _FACT_ITEM.format(
    # Zero goes as bytes too: -0.0 scales to the integer 0 and would come back as 0.0.
    confidence=f"CASE WHEN f.confidence <> 0 AND {_EXACT} THEN CAST({_SCALED} AS BIGINT)::text::json "
    "ELSE to_json(encode(float8send(f.confidence), 'hex')) END",
    created_at=_PG_STAMP.format("f.created_at"),
)
_PG_SECTION = f"c.section, c.summary, {_PG_STAMP.format('c.updated_at')}, c.extra::text"
_POSTGRESQL_LOAD = f"""
SELECT {_SCOPE},
  (SELECT json_agg(json_build_array({_PG_ITEM}, f.extra::text, f.visibility, {_PG_GRANTS},
     {_PG_RECORD}))::text {_LIVE}) AS facts,
  (SELECT json_agg(json_build_array({_PG_SECTION}))::text
     FROM memory_sections c WHERE c.scope_id = s.id) AS sections,
  {_PG_LINKS}
FROM memory_scopes s WHERE {_WHERE}
"""
_EXACT_CONFIDENCES = text(
    "SELECT fact_id, confidence FROM memory_facts WHERE scope_id = :scope_id AND deleted_revision IS NULL"
)


def _statement(sql: str) -> TextualSelect:
    return text(sql).columns(
        column("scope_id"),
        column("revision"),
        column("version"),
        column("scope_created_at", Timestamp),
        column("scope_updated_at", Timestamp),
        column("facts"),
        column("sections"),
        column("tags"),
        column("relations"),
    )


LOAD_STATEMENTS = {"sqlite": _statement(_SQLITE_LOAD), "postgresql": _statement(_POSTGRESQL_LOAD)}
"""The cold load per dialect, bound by ``statements.scope_keys``; no row means nothing is stored."""


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


def read_entry(conn: Connection, statement: TextualSelect, keys: dict[str, str]) -> CacheEntry | None:
    """The cache entry of the scope ``keys`` names, or None; the snapshot is left to the first save."""
    row = conn.execute(statement, keys).first()
    if row is None:
        return None
    items: list[list[Any]] = orjson.loads(row.facts) if row.facts is not None else []
    items.sort(key=lambda item: (item[0], item[1]))  # (scope_id, fact_id) is unique: no ties
    _attach_links(items, row.tags, row.relations)
    unsent = _decode_confidences(items)
    if unsent:
        exact: dict[str, float] = {
            fact_id: confidence
            for fact_id, confidence in conn.execute(_EXACT_CONFIDENCES, {"scope_id": row.scope_id})
        }
        for item in unsent:
            item[4] = exact[item[1]]
    section_rows = orjson.loads(row.sections) if row.sections is not None else []
    sections = {
        name: SectionValues(summary, _timestamp(updated_at), _extra(extra))
        for name, summary, updated_at, extra in section_rows
    }
    entry_stamp = stamp_of(row, row.revision)

    def group(names: tuple[str, ...]) -> dict[str, Any]:
        return {name: decode_section(sections.get(name, EMPTY_SECTION)) for name in names}

    document: MemoryDocument = {
        "version": row.version,
        "lastUpdated": format_timestamp(row.scope_updated_at),
        "revision": entry_stamp[1],
        INCARNATION_KEY: incarnation(entry_stamp),
        "user": group(USER_SECTIONS),
        "history": group(HISTORY_SECTIONS),
        "facts": list(map(_document_fact, items)),
    }
    return CacheEntry(entry_stamp, document, build=partial(_snapshot, items, sections))


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
