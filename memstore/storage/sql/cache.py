"""What ``SqlMemoryStorage`` caches per scope, and how an entry is built from rows or from a plan.

An entry is ``(stamp, document, snapshot)``. The stamp (scope row id, revision, created_at) is
what ``load`` compares with one cheap query; the row id and creation time catch a scope that was
erased and re-created up to the same revision number. The document is never handed out (``load``
copies it), and the snapshot is what the save fast path plans against.

Every document carries that identity as its ``incarnation``, next to its ``revision``: a
document loaded before an erase names a scope row that no longer exists, so its save is refused
(``write.late_write``) whatever revision the re-created scope has reached. The creation time is
part of it because SQLite may give a re-created row the erased row's id.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from operator import attrgetter
from typing import Any

from sqlalchemy import Row

from memstore.document import HISTORY_SECTIONS, USER_SECTIONS, MemoryDocument, as_utc, format_timestamp
from memstore.storage.sql.codec import (
    EMPTY_SECTION,
    INCARNATION_KEY,
    FactValues,
    SectionValues,
    decode_section,
    json_object,
)
from memstore.storage.sql.merge import MergePlan
from memstore.storage.sql.snapshot import Snapshot, snapshot_of

Stamp = tuple[int, int, datetime]
CacheEntry = tuple[Stamp, MemoryDocument, Snapshot]
AnyRow = Row[*tuple[Any, ...]]


def stamp(row: AnyRow) -> Stamp:
    return (row.id, row.revision, as_utc(row.created_at) or datetime.min)


def stamp_of(scope_row: AnyRow, revision: int) -> Stamp:
    return (scope_row.scope_id, revision, as_utc(scope_row.scope_created_at) or datetime.min)


def incarnation(stamp: Stamp) -> str:
    """The scope row's identity as a document carries it: row id and creation time."""
    return f"{stamp[0]}@{stamp[2].isoformat()}"


def _raw_timestamp(value: datetime | str | None) -> datetime | None:
    """A stamp as _LOAD_QUERY returns it: ISO text on SQLite, a datetime from psycopg."""
    return as_utc(datetime.fromisoformat(value) if isinstance(value, str) else value)


def _raw_json(value: object) -> dict[str, Any]:
    """An ``extra`` as _LOAD_QUERY returns it: JSON text on SQLite (nearly always ``{}``), a dict on PG."""
    if isinstance(value, str):
        return {} if value == "{}" else json_object(json.loads(value))
    return json_object(value)


def entry_from_rows(rows: Sequence[AnyRow]) -> CacheEntry:
    """The cache entry from the UNION rows (every row repeats the scope's columns).

    Rows are unpacked by position: named attribute access on ~100 rows cost more than the query.
    """
    first = rows[0]
    facts: list[tuple[int, str, FactValues]] = []
    sections: dict[str, SectionValues] = {}
    for (
        *_,
        kind,
        name,
        position,
        text,
        category,
        confidence,
        stamp,
        source,
        source_error,
        extra,
    ) in rows:
        if name is None:
            continue
        if kind == "f":
            values = FactValues(
                fact_id=name,
                content=text,
                category=category,
                confidence=confidence,
                created_at=_raw_timestamp(stamp),
                source=source,
                source_error=source_error,
                extra=_raw_json(extra),
            )
            facts.append((position, name, values))
        else:
            sections[name] = SectionValues(text, _raw_timestamp(stamp), _raw_json(extra))
    facts.sort(key=lambda item: (item[0], item[1]))
    snapshot = snapshot_of([item[2] for item in facts], [item[0] for item in facts], sections)
    entry_stamp = stamp_of(first, first.revision)
    document = _document(entry_stamp, first.version, first.scope_updated_at, snapshot)
    return entry_stamp, document, snapshot


def entry_after(
    scope_row: AnyRow,
    version: str,
    updated_at: datetime,
    revision: int,
    plan: MergePlan,
    previous: CacheEntry | None,
) -> CacheEntry:
    """The cache entry for the scope as the plan leaves it, reusing what ``previous`` decoded."""
    snapshot = snapshot_of(plan.facts, plan.positions, plan.sections, previous[2] if previous else None)
    entry_stamp = stamp_of(scope_row, revision)
    return entry_stamp, _document(entry_stamp, version, updated_at, snapshot), snapshot


_RAW_FACT = attrgetter("raw")


def _document(entry_stamp: Stamp, version: str, updated_at: datetime, snapshot: Snapshot) -> MemoryDocument:
    """The document of a snapshot; it shares the snapshot's (never mutated) fact and section dicts."""

    def group(names: tuple[str, ...]) -> dict[str, Any]:
        return {
            name: known.raw if (known := snapshot.sections.get(name)) else decode_section(EMPTY_SECTION)
            for name in names
        }

    return {
        "version": version,
        "lastUpdated": format_timestamp(updated_at),
        "revision": entry_stamp[1],
        INCARNATION_KEY: incarnation(entry_stamp),
        "user": group(USER_SECTIONS),
        "history": group(HISTORY_SECTIONS),
        "facts": list(map(_RAW_FACT, snapshot.facts.values())),
    }
