"""Writes outside ``save``: erasing a user and vacuuming old history and tombstones.

Both take the same per-scope write locks as a save (``BEGIN IMMEDIATE`` on SQLite, row locks
on PostgreSQL) and either delete scope rows or leave live data untouched, so every process's
cache notices through its revision stamp and no concurrent save can interleave.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

from sqlalchemy import ColumnElement, Connection, Engine, Table, case, delete, func, insert, select, update
from sqlalchemy.dialects import postgresql

from memstore.storage.sql.documents.statements import user_is
from memstore.storage.sql.engine import SQLITE_WRITE_OPTION
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.schema.fts_schema import FTS_TABLE
from memstore.storage.sql.schema.models import erasures_table as _erasures
from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.schema.models import history_table as _history
from memstore.storage.sql.schema.models import scopes_table as _scopes
from memstore.storage.sql.schema.models import sections_table as _sections


def user_digest(user_id: str) -> str:
    """The only trace of an erased user: enough to refuse its late updates, not to read its id."""
    return hashlib.sha256(user_id.encode("utf-8")).hexdigest()


def erased_at(conn: Connection, user_id: str) -> datetime | None:
    return conn.execute(
        select(_erasures.c.erased_at).where(_erasures.c.user_digest == user_digest(user_id))
    ).scalar_one_or_none()


def lock_user(conn: Connection, user_id: str | None) -> None:
    """PostgreSQL: a transaction lock on ``user_id`` that an erase and a save creating one of the
    user's scopes both take, so neither misses the other. Transaction-scoped, so it is safe
    behind connection poolers in transaction mode; a hash collision only serialises two users."""
    if user_id is not None and conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(user_id, 0))))


def erase_user(engine: Engine, user_id: str, now: datetime) -> dict[str, int]:
    """Delete every row of ``user_id`` in one transaction; returns the rows deleted per table."""
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as conn:
        if sqlite:
            # Deleted text is overwritten in the file instead of lingering in free pages (some
            # SQLite builds default to this, others not). Set on the driver connection, outside
            # SQLAlchemy's transaction handling (a pragma here would auto-begin a transaction).
            secure_delete = _sqlite_pragma(conn, "secure_delete")
            _sqlite_pragma(conn, "secure_delete = ON")
        conn.execution_options(**{SQLITE_WRITE_OPTION: True})
        try:
            with conn.begin():
                lock_user(conn, user_id)
                scope_ids = list(
                    conn.execute(select(_scopes.c.id).where(user_is(user_id)).with_for_update())
                    .scalars()
                    .all()
                )
                counts = {
                    "memory_history": _delete(conn, _history, scope_ids),
                    "memory_facts": _delete(conn, _facts, scope_ids),
                    "memory_sections": _delete(conn, _sections, scope_ids),
                    "memory_scopes": conn.execute(
                        delete(_scopes).where(_scopes.c.id.in_(scope_ids))
                    ).rowcount,
                    # Queued conversations too: a late update must not bring the user back.
                    "memory_queue": queue_table.erase_user(conn, user_id),
                }
                _record_erasure(conn, user_id, now)
                if sqlite and counts["memory_facts"]:
                    # FTS5 keeps deleted tokens in old segments until they are merged.
                    conn.exec_driver_sql(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('optimize')")
        finally:
            if sqlite:
                _sqlite_pragma(conn, f"secure_delete = {secure_delete}")
    return counts


def _sqlite_pragma(conn: Connection, pragma: str) -> object:
    driver = conn.connection.driver_connection
    assert driver is not None
    row = driver.execute(f"PRAGMA {pragma}").fetchone()
    return None if row is None else row[0]


def _delete(conn: Connection, table: Table, scope_ids: list[int]) -> int:
    return int(conn.execute(delete(table).where(table.c.scope_id.in_(scope_ids))).rowcount)


def _record_erasure(conn: Connection, user_id: str, now: datetime) -> None:
    values = {"user_digest": user_digest(user_id), "erased_at": now}
    if conn.dialect.name == "postgresql":
        statement = postgresql.insert(_erasures).values(values)
        conn.execute(statement.on_conflict_do_update(index_elements=["user_digest"], set_={"erased_at": now}))
    else:
        conn.execute(insert(_erasures).prefix_with("OR REPLACE").values(values))


def vacuum(engine: Engine, cutoff: datetime) -> dict[str, int]:
    """Purge history, tombstones and erasure records older than ``cutoff``.

    Scopes remember the newest purged tombstone revision (``purged_revision``); a save of a
    document loaded before it is refused, since it could otherwise resurrect a purged fact.
    """
    old_tombstone = _old_tombstone(cutoff)
    newest_purged = (
        select(func.max(_facts.c.deleted_revision))
        .where(_facts.c.scope_id == _scopes.c.id, old_tombstone)
        .scalar_subquery()
    )
    with engine.connect() as conn:
        conn.execution_options(**{SQLITE_WRITE_OPTION: True})
        with conn.begin():
            conn.execute(
                update(_scopes)
                .where(_scopes.c.id.in_(select(_facts.c.scope_id).where(old_tombstone)))
                .values(
                    purged_revision=case(
                        (newest_purged > _scopes.c.purged_revision, newest_purged),
                        else_=_scopes.c.purged_revision,
                    )
                )
            )
            return {
                name: int(conn.execute(delete(table).where(where)).rowcount)
                for name, (table, where) in _vacuumed(cutoff).items()
            }


def vacuum_counts(engine: Engine, cutoff: datetime) -> dict[str, int]:
    """The rows ``vacuum(engine, cutoff)`` would delete, per table; deletes nothing."""
    with engine.connect() as conn:
        return {
            name: int(conn.execute(select(func.count()).select_from(table).where(where)).scalar_one())
            for name, (table, where) in _vacuumed(cutoff).items()
        }


def _old_tombstone(cutoff: datetime) -> ColumnElement[bool]:
    return (_facts.c.deleted_revision.is_not(None)) & (_facts.c.deleted_at < cutoff)


def _vacuumed(cutoff: datetime) -> dict[str, tuple[Table, ColumnElement[bool]]]:
    """What vacuum deletes, per table: one definition for the purge and for its count."""
    return {
        "memory_facts": (_facts, _old_tombstone(cutoff)),
        "memory_history": (_history, _history.c.changed_at < cutoff),
        "memory_erasures": (_erasures, _erasures.c.erased_at < cutoff),
    }
