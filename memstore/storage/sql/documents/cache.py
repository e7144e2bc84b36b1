"""What ``SqlMemoryStorage`` caches per scope, and how an entry is built from a plan.

An entry holds a stamp, a document and a snapshot (``load.py`` builds a cold load's entry). The
stamp (scope row id, revision, created_at) is what ``load`` compares with one cheap query; the
row id and creation time catch a scope that was erased and re-created up to the same revision
number. The document is never handed out (``load`` copies it), and the snapshot is what the save
fast path plans against.

Every document carries that identity as its ``incarnation``, next to its ``revision``: a
document loaded before an erase names a scope row that no longer exists, so its save is refused
(``write.late_write``) whatever revision the re-created scope has reached. The creation time is
part of it because SQLite may give a re-created row the erased row's id.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from operator import attrgetter
from typing import Any

from sqlalchemy import Row

from memstore.document import HISTORY_SECTIONS, USER_SECTIONS, MemoryDocument, as_utc, format_timestamp
from memstore.storage.sql.documents.codec import EMPTY_SECTION, INCARNATION_KEY, decode_section
from memstore.storage.sql.documents.merge import MergePlan
from memstore.storage.sql.documents.snapshot import Snapshot, snapshot_of

Stamp = tuple[int, int, datetime]
AnyRow = Row[*tuple[Any, ...]]


class CacheEntry:
    """A scope's stamp, its document and the snapshot the save fast path plans against.

    A cold load (``load.py``) leaves the snapshot to be built by the first save that asks for it:
    most loads are reads, and decoding every row was most of a load's cost.
    """

    __slots__ = ("_build", "_snapshot", "document", "stamp")

    def __init__(
        self,
        stamp: Stamp,
        document: MemoryDocument,
        snapshot: Snapshot | None = None,
        *,
        build: Callable[[], Snapshot] | None = None,
    ) -> None:
        self.stamp = stamp
        self.document = document
        self._snapshot = snapshot
        self._build = build

    @property
    def snapshot(self) -> Snapshot:
        # Two threads may both build it: the results are equal, and either may stay.
        snapshot = self._snapshot
        if snapshot is None:
            assert self._build is not None, "an entry has a snapshot or a way to build one"
            snapshot = self._snapshot = self._build()
        return snapshot


def stamp(row: AnyRow) -> Stamp:
    return (row.id, row.revision, as_utc(row.created_at) or datetime.min)


def stamp_of(scope_row: AnyRow, revision: int) -> Stamp:
    return (scope_row.scope_id, revision, as_utc(scope_row.scope_created_at) or datetime.min)


def incarnation(stamp: Stamp) -> str:
    """The scope row's identity as a document carries it: row id and creation time."""
    return f"{stamp[0]}@{stamp[2].isoformat()}"


def entry_after(
    scope_row: AnyRow,
    version: str,
    updated_at: datetime,
    revision: int,
    plan: MergePlan,
    previous: CacheEntry | None,
) -> CacheEntry:
    """The cache entry for the scope as the plan leaves it, reusing what ``previous`` decoded."""
    snapshot = snapshot_of(plan.facts, plan.positions, plan.sections, previous.snapshot if previous else None)
    entry_stamp = stamp_of(scope_row, revision)
    return CacheEntry(entry_stamp, _document(entry_stamp, version, updated_at, snapshot), snapshot)


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
