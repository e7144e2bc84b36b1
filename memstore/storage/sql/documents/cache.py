"""What ``SqlMemoryStorage`` caches per scope, and how an entry is built from a plan.

An entry holds a stamp, the document's JSON text and a snapshot (``load.py`` builds a cold load's
entry). The stamp (scope row id, revision, created_at) is what ``load`` compares with one cheap
query; the row id and creation time catch a scope that was erased and re-created up to the same
revision number. The document is kept as text (the scope fields aside): every load parses a
fresh, private copy from it, which costs less than copying a cached dict, and a save writes the
same text to the scope's derived snapshot row (``stored.py``). The snapshot is what the save fast
path plans against.

Every document carries that identity as its ``incarnation``, next to its ``revision``: a
document loaded before an erase names a scope row that no longer exists, so its save is refused
(``write.late_write``) whatever revision the re-created scope has reached. The creation time is
part of it because SQLite may give a re-created row the erased row's id.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Row

from memstore.document import HISTORY_SECTIONS, USER_SECTIONS, MemoryDocument, as_utc, format_timestamp
from memstore.storage.sql.documents.codec import EMPTY_SECTION, INCARNATION_KEY, decode_section
from memstore.storage.sql.documents.json_values import exact_text
from memstore.storage.sql.documents.merge import MergePlan
from memstore.storage.sql.documents.snapshot import Snapshot, snapshot_appended, snapshot_of
from memstore.storage.sql.documents.statements import ScopeRow

Stamp = tuple[int, int, datetime]
AnyRow = Row[*tuple[Any, ...]]
Body = bytes | str
"""The JSON text of a document's ``user``, ``history`` and ``facts`` keys."""


class CacheEntry:
    """A scope's stamp, its document as text and the snapshot the save fast path plans against.

    ``exact`` says the text is ``orjson``'s (``json_values.exact_text``), parsed by it; otherwise it
    is the standard library's (a value orjson cannot write exactly, an integer beyond 64 bits).
    ``storable``: a save's entry whose every fact and section has an exact text, fit to be the
    scope's snapshot row (``stored.write_snapshot``). A cold load leaves the snapshot to
    be built by the first save that asks for it: most loads are reads. ``first`` is the document
    the cold load built, handed to its caller by ``take`` before the entry is cached, so that one
    load parses nothing.
    """

    __slots__ = ("_build", "_first", "_snapshot", "body", "exact", "head", "stamp", "storable")

    def __init__(
        self,
        stamp: Stamp,
        head: tuple[str, str],
        body: Body,
        *,
        exact: bool,
        storable: bool = False,
        snapshot: Snapshot | None = None,
        build: Callable[[], Snapshot] | None = None,
        first: MemoryDocument | None = None,
    ) -> None:
        self.stamp = stamp
        self.head = head  # (version, lastUpdated)
        self.body = body
        self.exact = exact
        self.storable = storable
        self._snapshot = snapshot
        self._build = build
        self._first = first

    @property
    def snapshot(self) -> Snapshot:
        # Two threads may both build it: the results are equal, and either may stay.
        snapshot = self._snapshot
        if snapshot is None:
            assert self._build is not None, "an entry has a snapshot or a way to build one"
            snapshot = self._snapshot = self._build()
        return snapshot

    def take(self) -> MemoryDocument:
        """A private copy of the document: the cold load's own once (call before caching the
        entry, so no other thread can take it too), then one parsed from the text per call."""
        first, self._first = self._first, None
        if first is not None:
            return first
        parts = orjson.loads(self.body) if self.exact else json.loads(self.body)
        return {
            "version": self.head[0],
            "lastUpdated": self.head[1],
            "revision": self.stamp[1],
            INCARNATION_KEY: incarnation(self.stamp),
            **parts,
        }


def stamp(row: AnyRow) -> Stamp:
    return (row.id, row.revision, as_utc(row.created_at) or datetime.min)


def stamp_of(scope_row: ScopeRow, revision: int) -> Stamp:
    return (scope_row.scope_id, revision, as_utc(scope_row.scope_created_at) or datetime.min)


def incarnation(stamp: Stamp) -> str:
    """The scope row's identity as a document carries it: row id and creation time."""
    return f"{stamp[0]}@{stamp[2].isoformat()}"


def body_text(document: MemoryDocument) -> tuple[Body, bool]:
    """The text of a built document's parts and whether it is exact (see ``CacheEntry``)."""
    parts = {"user": document["user"], "history": document["history"], "facts": document["facts"]}
    text = exact_text(parts)
    if text is not None:
        return text, True
    return json.dumps(parts, ensure_ascii=False, allow_nan=False, separators=(",", ":")), False


def entry_after(
    scope_row: ScopeRow,
    version: str,
    updated_at: datetime,
    revision: int,
    plan: MergePlan,
    previous: CacheEntry | None,
) -> CacheEntry:
    """The cache entry for the scope as the plan leaves it, reusing what ``previous`` decoded.

    The text joins each kept fact's own (``KnownFact.text``), so its cost follows the facts that
    changed, not the scope's size; the six sections are written out each time."""
    if plan.appended and previous is not None:
        snapshot = snapshot_appended(previous.snapshot, plan)
    else:
        before = previous.snapshot if previous else None
        snapshot = snapshot_of(plan.facts, plan.positions, plan.sections, before)
    entry_stamp = stamp_of(scope_row, revision)
    head = (version, format_timestamp(updated_at))
    user, history = _group(snapshot, USER_SECTIONS), _group(snapshot, HISTORY_SECTIONS)
    sections = exact_text({"user": user, "history": history})
    if sections is None or snapshot.text is None:
        document = {
            "user": user,
            "history": history,
            "facts": [known.raw for known in snapshot.facts.values()],
        }
        body, exact = body_text(document)
        return CacheEntry(entry_stamp, head, body, exact=exact, snapshot=snapshot)
    body = b"".join((sections[:-1], b',"facts":', snapshot.text, b"}"))
    return CacheEntry(entry_stamp, head, body, exact=True, storable=True, snapshot=snapshot)


def _group(snapshot: Snapshot, names: tuple[str, ...]) -> dict[str, Any]:
    return {
        name: known.raw if (known := snapshot.sections.get(name)) else decode_section(EMPTY_SECTION)
        for name in names
    }
