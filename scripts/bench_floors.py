"""The floors: hand-written driver code that reads the same rows into the same document dict.

They are what the SQL provider would cost with no SQLAlchemy at all, so the ratio to them is
the price of the abstraction. They read in one transaction (one consistent snapshot), as the
provider does, and the benchmark checks that they return exactly what the provider returns.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from typing import Any

from memstore.document import HISTORY_SECTIONS, USER_SECTIONS

_SQLITE_SCOPE = (
    "SELECT id, revision, version, updated_at, created_at FROM memory_scopes "
    "WHERE coalesce(user_id, '') = ? AND coalesce(agent_name, '') = ?"
)
_FACT_COLUMNS = "fact_id, content, category, confidence, created_at, source, source_error, extra"
_SQLITE_FACTS = (
    f"SELECT {_FACT_COLUMNS} FROM memory_facts "
    "WHERE scope_id = ? AND deleted_revision IS NULL ORDER BY position, fact_id"
)
_SQLITE_SECTIONS = "SELECT section, summary, updated_at, extra FROM memory_sections WHERE scope_id = ?"

# PostgreSQL: one statement, one round trip; scope columns repeat on every row.
_PG_FACT_COLUMNS = ", ".join("f." + column for column in _FACT_COLUMNS.split(", "))
_PG_LOAD = f"""
SELECT s.id, s.revision, s.version, s.updated_at, 'f', {_PG_FACT_COLUMNS}, f.position, s.created_at
FROM memory_scopes s LEFT JOIN memory_facts f ON f.scope_id = s.id AND f.deleted_revision IS NULL
WHERE coalesce(s.user_id, '') = %(user)s AND coalesce(s.agent_name, '') = ''
UNION ALL
SELECT s.id, s.revision, s.version, s.updated_at, 's', c.section, c.summary, NULL, NULL, c.updated_at,
       NULL, NULL, c.extra, NULL, s.created_at
FROM memory_scopes s JOIN memory_sections c ON c.scope_id = s.id
WHERE coalesce(s.user_id, '') = %(user)s AND coalesce(s.agent_name, '') = ''
"""


def _iso(value: datetime | str | None) -> str | None:
    if value is None:
        return None
    parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    if parsed.tzinfo is not None:  # psycopg answers in the session's time zone
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed.isoformat() + "Z"


def _incarnation(scope_id: int, created_at: datetime | str) -> str:
    """The scope row's identity, as the provider's documents carry it (``cache.incarnation``)."""
    parsed = datetime.fromisoformat(created_at) if isinstance(created_at, str) else created_at
    parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    return f"{scope_id}@{parsed.isoformat()}"


def _fact(row: tuple[Any, ...], extra: dict[str, Any]) -> dict[str, Any]:
    fact_id, content, category, confidence, created_at, source, source_error = row[:7]
    item: dict[str, Any] = {"id": fact_id, "content": content, "category": category, "confidence": confidence}
    if created_at is not None:
        item["createdAt"] = _iso(created_at)
    if source is not None:
        item["source"] = source
    if source_error is not None:
        item["sourceError"] = source_error
    item.update(extra)  # the benchmark's facts carry no $memstore overrides
    return item


def _document(
    version: str,
    updated_at: Any,
    revision: int,
    incarnation: str,
    sections: dict[str, dict[str, Any]],
    facts: list[Any],
) -> dict[str, Any]:
    def group(names: tuple[str, ...]) -> dict[str, Any]:
        return {name: sections.get(name, {"summary": "", "updatedAt": ""}) for name in names}

    return {
        "version": version,
        "lastUpdated": _iso(updated_at),
        "revision": revision,
        "incarnation": incarnation,
        "user": group(USER_SECTIONS),
        "history": group(HISTORY_SECTIONS),
        "facts": facts,
    }


def sqlite_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def sqlite_load(conn: sqlite3.Connection, user_id: str) -> dict[str, Any] | None:
    conn.execute("BEGIN")
    try:
        scope = conn.execute(_SQLITE_SCOPE, (user_id, "")).fetchone()
        if scope is None:
            return None
        facts = conn.execute(_SQLITE_FACTS, (scope[0],)).fetchall()
        sections = conn.execute(_SQLITE_SECTIONS, (scope[0],)).fetchall()
    finally:
        conn.execute("COMMIT")
    return _document(
        scope[2],
        scope[3],
        scope[1],
        _incarnation(scope[0], scope[4]),
        {
            name: {"summary": summary, "updatedAt": _iso(updated) or "", **json.loads(extra)}
            for name, summary, updated, extra in sections
        },
        [_fact(row, json.loads(row[7])) for row in facts],
    )


def psycopg_load(conn: Any, user_id: str) -> dict[str, Any] | None:
    """``conn`` is an autocommit psycopg connection: the SELECT is the only round trip."""
    rows = conn.execute(_PG_LOAD, {"user": user_id}).fetchall()
    if not rows:
        return None
    facts: list[tuple[int, str, dict[str, Any]]] = []
    sections: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row[5] is None:
            continue
        if row[4] == "f":
            facts.append((row[13], row[5], _fact(row[5:12], row[12])))
        else:
            sections[row[5]] = {"summary": row[6], "updatedAt": _iso(row[9]) or "", **row[12]}
    facts.sort(key=lambda item: (item[0], item[1]))
    first = rows[0]
    incarnation = _incarnation(first[0], first[14])
    return _document(first[2], first[3], first[1], incarnation, sections, [item[2] for item in facts])
