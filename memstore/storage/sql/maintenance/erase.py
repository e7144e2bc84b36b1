"""Writes outside ``save``: erasing a user and vacuuming old history and tombstones.

Both take the same per-scope write locks as a save (``BEGIN IMMEDIATE`` on SQLite, row locks
on PostgreSQL) and either delete scope rows or leave live data untouched, so every process's
cache notices through its revision stamp and no concurrent save can interleave. Both cross
tenants' rows, so on PostgreSQL they run on the operator's connection (``operator.py``).
"""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Table,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import OperationalError

from memstore.scope import DEFAULT_TENANT_ID, validate_tenant_id
from memstore.storage.sql.agent_docs.store import erase_user_documents
from memstore.storage.sql.documents.grants import SHARED
from memstore.storage.sql.documents.statements import user_is
from memstore.storage.sql.engine import SQLITE_WRITE_OPTION, driver_execute
from memstore.storage.sql.maintenance.history_months import (
    DEFAULT_PARTITION,
    HISTORY,
    HISTORY_KEY,
    droppable_months,
    ensure_months,
    existing_months,
    month_transaction,
    utc,
)
from memstore.storage.sql.maintenance.operator import operator_engine
from memstore.storage.sql.schema.fts_schema import FTS_TABLE
from memstore.storage.sql.schema.models import claims_table as _claims
from memstore.storage.sql.schema.models import erasures_table as _erasures
from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.schema.models import grants_table as _grants
from memstore.storage.sql.schema.models import history_table as _history
from memstore.storage.sql.schema.models import queue_table as _queue
from memstore.storage.sql.schema.models import relations_table as _relations
from memstore.storage.sql.schema.models import scopes_table as _scopes
from memstore.storage.sql.schema.models import sections_table as _sections
from memstore.storage.sql.schema.models import session_turns_table as _session_turns
from memstore.storage.sql.schema.models import sessions_table as _sessions
from memstore.storage.sql.schema.models import snapshots_table as _snapshots
from memstore.storage.sql.schema.models import store_item_history_table as _store_history
from memstore.storage.sql.schema.models import store_items_table as _store_items
from memstore.storage.sql.schema.models import tags_table as _tags
from memstore.storage.sql.schema.partition_layout import is_partitioned

_log = logging.getLogger(__name__)


def erasure_digest(tenant_id: str, user_id: str) -> str:
    """The only trace of an erased user: enough to refuse its late updates, not to read its id.

    The default tenant's digest is the user id's alone, as before tenants, so erasures recorded
    then still fence; any other tenant's covers ``tenant NUL user`` (NUL is in no valid id).
    """
    key = user_id if tenant_id == DEFAULT_TENANT_ID else f"{tenant_id}\0{user_id}"
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def erased_at(conn: Connection, user_id: str, tenant_id: str = DEFAULT_TENANT_ID) -> datetime | None:
    return conn.execute(
        select(_erasures.c.erased_at).where(_erasures.c.user_digest == erasure_digest(tenant_id, user_id))
    ).scalar_one_or_none()


def lock_user(conn: Connection, user_id: str | None, tenant_id: str = DEFAULT_TENANT_ID) -> None:
    """PostgreSQL: a transaction lock on the tenant's ``user_id`` that an erase and a save creating
    one of the user's scopes both take, so neither misses the other. Transaction-scoped, so it is
    safe behind connection poolers in transaction mode; a hash collision only serialises two users."""
    if user_id is not None and conn.dialect.name == "postgresql":
        key = f"{tenant_id}/{user_id}"  # "/" is in no valid id
        conn.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(key, 0))))


def erase_user(
    engine: Engine, user_id: str, now: datetime, tenant_id: str = DEFAULT_TENANT_ID
) -> dict[str, int]:
    """Delete every row of ``user_id`` in ``tenant_id`` in one transaction, on the operator's
    connection; returns the rows deleted per table. The same user id in another tenant is
    another person and keeps its memory."""
    tenant_id = validate_tenant_id(tenant_id)
    engine = operator_engine(engine, "erase")
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
                lock_user(conn, user_id, tenant_id)
                scope_ids = list(
                    conn.execute(
                        select(_scopes.c.id)
                        .where(user_is(user_id), _scopes.c.tenant_id == tenant_id)
                        .with_for_update()
                    )
                    .scalars()
                    .all()
                )
                _unshare(conn, tenant_id, user_id, now)
                counts = {
                    "memory_history": _delete(conn, _history, scope_ids),
                    # The user's own grants go with its facts; these name it on others' facts.
                    "memory_fact_grants": _delete(conn, _grants, scope_ids)
                    + _delete_where(
                        conn,
                        _grants,
                        (_grants.c.tenant_id == tenant_id)
                        & (_grants.c.grantee_kind == "user")
                        & (_grants.c.grantee == user_id),
                    ),
                    "memory_fact_tags": _delete(conn, _tags, scope_ids),
                    "memory_fact_relations": _delete(conn, _relations, scope_ids),
                    "memory_facts": _delete(conn, _facts, scope_ids),
                    "memory_sections": _delete(conn, _sections, scope_ids),
                    "memory_scopes": conn.execute(
                        delete(_scopes).where(_scopes.c.id.in_(scope_ids))
                    ).rowcount,
                }
                # Queued conversations too: a late update must not bring the user back. Their
                # claims go first: every queue writer (a heartbeat, a claim, a settle) locks claims
                # before queue rows (``queue/fence.py``), and PostgreSQL aborts one of two
                # transactions that take them in opposite orders.
                _delete_where(conn, _claims, _of_user(_claims, tenant_id, user_id))
                counts["memory_queue"] = _delete_where(conn, _queue, _of_user(_queue, tenant_id, user_id))
                counts |= {
                    # Short-term memory too, turns before their sessions.
                    "memory_session_turns": _delete_where(
                        conn, _session_turns, _of_user(_session_turns, tenant_id, user_id)
                    ),
                    "memory_sessions": _delete_where(
                        conn, _sessions, _of_user(_sessions, tenant_id, user_id)
                    ),
                    # The LangGraph store's items of every agent, and their history.
                    "memory_store_item_history": _delete_where(
                        conn, _store_history, _of_user(_store_history, tenant_id, user_id)
                    ),
                    "memory_store_items": _delete_where(
                        conn, _store_items, _of_user(_store_items, tenant_id, user_id)
                    ),
                }
                # The user's own agent documents; its name leaves the agents' own ones' history.
                counts.update(erase_user_documents(conn, tenant_id, user_id))
                _record_erasure(conn, tenant_id, user_id, now)
                if sqlite and counts["memory_facts"]:
                    # FTS5 keeps deleted tokens in old segments until they are merged.
                    conn.exec_driver_sql(f"INSERT INTO {FTS_TABLE}({FTS_TABLE}) VALUES ('optimize')")
            if sqlite and any(counts.values()):
                # secure_delete zeroes the cells it deletes, but a b-tree split or a row that grew
                # may have left an older copy in the unused part of a live page: only rewriting the
                # file removes every copy (it takes time in proportion to the file's size).
                _sqlite_pragma(conn, "wal_checkpoint(TRUNCATE)")  # no old page left in the WAL either
                driver_execute(conn, "VACUUM")  # on the driver: SQLAlchemy would open a transaction first
        finally:
            if sqlite:
                _sqlite_pragma(conn, f"secure_delete = {secure_delete}")
    return counts


def _sqlite_pragma(conn: Connection, pragma: str) -> object:
    rows = driver_execute(conn, f"PRAGMA {pragma}")
    return rows[0][0] if rows else None


def _unshare(conn: Connection, tenant_id: str, user_id: str, now: datetime) -> None:
    """Move every scope holding a fact shared with ``user_id`` by name to a new revision, before
    ``erase_user`` deletes those grants: their documents change, so, as for a save, the scope's row
    lock waits for a save under way, every process's cache and derived snapshot stop being current,
    and each such live fact is marked updated at it, so a document loaded before the erase keeps the
    stored fact (``merge.py``: first committer wins) instead of granting the user it again as the
    caller's edit. The snapshots go too: their text names the user. Locked in ``id`` order, so two
    erases never deadlock; per scope, so a distributed database runs each on one shard."""
    named = (
        (_grants.c.tenant_id == tenant_id)
        & (_grants.c.grantee_kind == "user")
        & (_grants.c.grantee == user_id)
    )
    sharing = list(conn.execute(select(_grants.c.scope_id).where(named).distinct()).scalars())
    if not sharing:
        return
    locked = conn.execute(
        select(_scopes.c.id, _scopes.c.revision)
        .where(_scopes.c.id.in_(sharing))
        .order_by(_scopes.c.id)
        .with_for_update()
    ).all()
    bumps = [{"b_id": scope_id, "b_revision": revision + 1, "b_now": now} for scope_id, revision in locked]
    if not bumps:  # the scopes went meanwhile (an erase of their owners)
        return
    conn.execute(
        update(_scopes)
        .where(_scopes.c.id == bindparam("b_id"))
        .values(
            revision=bindparam("b_revision"), updated_at=bindparam("b_now", type_=_scopes.c.updated_at.type)
        ),
        bumps,
    )
    granted = select(_grants.c.fact_row_id).where(_grants.c.scope_id == bindparam("b_id"), named)
    conn.execute(
        update(_facts)
        .where(
            _facts.c.scope_id == bindparam("b_id"),
            _facts.c.id.in_(granted),
            _facts.c.deleted_revision.is_(None),
            _facts.c.visibility == SHARED,
        )
        .values(updated_revision=bindparam("b_revision")),
        bumps,
    )
    _delete_where(conn, _snapshots, _snapshots.c.scope_id.in_([bump["b_id"] for bump in bumps]))


def _delete(conn: Connection, table: Table, scope_ids: list[int]) -> int:
    return _delete_where(conn, table, table.c.scope_id.in_(scope_ids))


def _delete_where(conn: Connection, table: Table, where: ColumnElement[bool]) -> int:
    return int(conn.execute(delete(table).where(where)).rowcount)


def _of_user(table: Table, tenant_id: str, user_id: str) -> ColumnElement[bool]:
    return (table.c.tenant_id == tenant_id) & (table.c.user_id == user_id)


def _record_erasure(conn: Connection, tenant_id: str, user_id: str, now: datetime) -> None:
    values = {"user_digest": erasure_digest(tenant_id, user_id), "tenant_id": tenant_id, "erased_at": now}
    if conn.dialect.name == "postgresql":
        statement = postgresql.insert(_erasures).values(values)
        conn.execute(statement.on_conflict_do_update(index_elements=["user_digest"], set_={"erased_at": now}))
    else:
        conn.execute(insert(_erasures).prefix_with("OR REPLACE").values(values))


def vacuum(engine: Engine, cutoff: datetime) -> dict[str, int]:
    """Purge history, tombstones and erasure records older than ``cutoff``.

    Scopes remember the newest purged tombstone revision (``purged_revision``); a save of a
    document loaded before it is refused, since it could otherwise resurrect a purged fact. On the
    partitioned layout whole months of history older than ``cutoff`` are dropped instead of deleted
    row by row, and history's months ahead created (``history_months.ensure_months``): both lock
    history exclusively, so they run after the purge commits, each in its own short transaction; a
    month whose lock is not had in time is left for the next vacuum (its rows are not counted).
    """
    cutoff = utc(cutoff)
    old_tombstone = _old_tombstone(cutoff)
    newest_purged = (
        select(func.max(_facts.c.deleted_revision))
        .where(_facts.c.scope_id == _scopes.c.id, old_tombstone)
        .scalar_subquery()
    )
    with operator_engine(engine, "vacuum").connect() as conn:
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
            partitioned = is_partitioned(conn, HISTORY)
            vacuumed = _vacuumed(cutoff)
            if partitioned:
                del vacuumed["memory_history"]  # below, partition by partition
            counts = {
                name: int(conn.execute(delete(table).where(where)).rowcount)
                for name, (table, where) in vacuumed.items()
            }
            if partitioned:
                counts["memory_history"] = _purge_history_partitions(conn, cutoff)
        if partitioned:
            counts["memory_history"] += _drop_months(conn, cutoff)
            _create_months(conn)
        return counts


def _purge_history_partitions(conn: Connection, cutoff: datetime) -> int:
    """Delete the rows older than ``cutoff`` that no droppable month holds: those of the month the
    cut-off falls in and of the default partition (the months after it hold none)."""
    droppable = set(droppable_months(conn, cutoff))
    partitions = [
        month.name for month in existing_months(conn) if month not in droppable and month.start < cutoff
    ]
    deleted = 0
    for name in (*partitions, DEFAULT_PARTITION):
        statement = text(f"DELETE FROM {name} WHERE {HISTORY_KEY} < :cutoff")
        deleted += int(conn.execute(statement, {"cutoff": cutoff}).rowcount)
    return deleted


def _drop_months(conn: Connection, cutoff: datetime) -> int:
    """Drop the months that end by ``cutoff``, one short transaction each; returns the rows dropped."""
    dropped = 0
    with conn.begin():
        months = droppable_months(conn, cutoff)
    for month in months:
        try:
            with month_transaction(conn):
                if month not in existing_months(conn):  # another vacuum dropped it meanwhile
                    continue
                rows = int(conn.exec_driver_sql(f"SELECT count(*) FROM {month.name}").scalar_one())
                conn.exec_driver_sql(f"DROP TABLE {month.name}")
        except OperationalError as exc:
            _log.warning("vacuum: %s not dropped, left for the next vacuum: %s", month.name, exc.orig)
            continue
        dropped += rows
    return dropped


def _create_months(conn: Connection) -> None:
    """History's current month and the months ahead, in a short transaction of their own."""
    try:
        with month_transaction(conn):
            ensure_months(conn, datetime.now(UTC))
    except OperationalError as exc:
        _log.warning("vacuum: history's months ahead not created, left for the next vacuum: %s", exc.orig)


def vacuum_counts(engine: Engine, cutoff: datetime) -> dict[str, int]:
    """The rows ``vacuum(engine, cutoff)`` would delete, per table; deletes nothing."""
    with operator_engine(engine, "vacuum").connect() as conn:
        return {
            name: int(conn.execute(select(func.count()).select_from(table).where(where)).scalar_one())
            for name, (table, where) in _vacuumed(cutoff).items()
        }


def _old_tombstone(cutoff: datetime) -> ColumnElement[bool]:
    """A fact deleted before ``cutoff`` that no relation names: purging a relation's target would
    silently take the relation from the live fact that states it (a correction, a merge)."""
    named = exists().where(
        _relations.c.scope_id == _facts.c.scope_id, _relations.c.target_fact_id == _facts.c.fact_id
    )
    return (_facts.c.deleted_revision.is_not(None)) & (_facts.c.deleted_at < cutoff) & ~named


def _vacuumed(cutoff: datetime) -> dict[str, tuple[Table, ColumnElement[bool]]]:
    """What vacuum deletes, per table: one definition for the purge and for its count."""
    return {
        "memory_facts": (_facts, _old_tombstone(cutoff)),
        "memory_history": (_history, _history.c.changed_at < cutoff),
        "memory_erasures": (_erasures, _erasures.c.erased_at < cutoff),
    }
