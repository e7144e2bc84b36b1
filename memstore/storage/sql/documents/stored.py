"""The scope's derived snapshot row (``memory_scope_snapshots``): written by a save, read by a cold load.

Each save that changes a scope writes, in its own transaction, the document it leaves (the text
the provider caches: ``cache.entry_after``) with the new revision. The cold load reads it, one row
of text, instead of building the document from every fact row, but only while its revision is
the scope's (``SNAPSHOT_JOIN``): every writer that changes a document moves the scope's revision,
which is what the provider's caches rely on too, so a writer that does not write the snapshot (an
older memstore, a DBA, a save whose rows differ from its plan) makes loads read the rows again
until the next save. An erase deletes it with the scope; ``erase_user`` moves the revision of the
scopes whose facts were shared with the erased user (their grants go) and deletes their snapshots.

The row also keeps what the document does not say and the next save needs to plan against it
(``layout``): the facts' stored positions and which sections have a row. A snapshot rebuilt from
them (``snapshot_from_text``) is the one the rows would give: the codec's decoding is lossless.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

import orjson
from sqlalchemy import Connection

from memstore.document import SECTION_GROUPS
from memstore.storage.sql.documents.cache import Body, CacheEntry
from memstore.storage.sql.documents.codec import encode_fact, encode_section
from memstore.storage.sql.documents.json_values import jsonb_stable
from memstore.storage.sql.documents.snapshot import Snapshot, snapshot_of
from memstore.storage.sql.driver import driver_rows

_STABLE = attrgetter("stable")

SNAPSHOT_JOIN = "LEFT JOIN memory_scope_snapshots d ON d.scope_id = s.id AND d.revision = s.revision"
"""The scope's snapshot row while it is current (``s`` the scope, ``d`` the snapshot)."""

_COLUMNS = "(scope_id, revision, document, layout)"
_UPDATE = "revision = excluded.revision, document = excluded.document, layout = excluded.layout"
UPSERT = {
    "sqlite": f"INSERT INTO memory_scope_snapshots {_COLUMNS} VALUES (:scope_id, :revision, :document, "
    f":layout) ON CONFLICT (scope_id) DO UPDATE SET {_UPDATE}",
    "postgresql": f"INSERT INTO memory_scope_snapshots {_COLUMNS} VALUES (%(scope_id)s, %(revision)s, "
    f"%(document)s, %(layout)s) ON CONFLICT (scope_id) DO UPDATE SET {_UPDATE}",
}


def write_snapshot(conn: Connection, scope_id: int, entry: CacheEntry) -> None:
    """Store ``entry`` (the document a save leaves, at its revision) as the scope's snapshot, in the
    save's transaction. Not an entry that is not ``storable`` (``CacheEntry``), nor on PostgreSQL one
    holding an ``extra`` its JSONB would give back otherwise (``json_values.jsonb_stable``): the rows
    would read differently. The scope's loads then read its rows until a save leaves one that is."""
    snapshot = entry.snapshot
    if not entry.storable or (conn.dialect.name == "postgresql" and not _jsonb_stable(snapshot)):
        return
    layout = orjson.dumps([list(snapshot.positions.values()), list(snapshot.sections)]).decode()
    parameters = {
        "scope_id": scope_id,
        "revision": entry.stamp[1],
        "document": _text(entry.body),
        "layout": layout,
    }
    driver_rows(conn, UPSERT[conn.dialect.name], parameters)


def snapshot_from_text(body: Body, layout: str) -> Snapshot:
    """The ``Snapshot`` of a scope loaded from its snapshot row: each fact and stored section
    encoded from its document form again, at the positions the row recorded."""
    document: dict[str, Any] = orjson.loads(body)
    positions, stored_sections = orjson.loads(layout)
    facts = [encode_fact(raw, raw["id"]) for raw in document["facts"]]
    group_of = {name: group for group, names in SECTION_GROUPS.items() for name in names}
    sections = {name: encode_section(document[group_of[name]][name]) for name in stored_sections}
    return snapshot_of(facts, positions, sections)


def _jsonb_stable(snapshot: Snapshot) -> bool:
    sections = snapshot.sections.values()
    return all(map(_STABLE, snapshot.facts.values())) and all(jsonb_stable(s.values.extra) for s in sections)


def _text(body: Body) -> str:
    return body if isinstance(body, str) else body.decode()
