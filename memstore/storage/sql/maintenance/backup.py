"""Every row of memstore's memory tables, out of one database and into another, on either dialect.

What ``memstore backup`` and ``restore`` move (``memstore.ops.backup`` owns the file). A row is
encoded as JSON values that mean the same on SQLite and PostgreSQL: timestamps as UTC ISO
strings, JSON columns as their JSON text (so SQL NULL stays distinct from JSON ``null``, which
``before IS NULL`` relies on), vectors as base64 of their float32 little-endian bytes. Ids are kept,
so foreign keys, revisions and tombstones come back exactly as they were.

The durable queue's tables are not memory but work in flight (conversation text waiting for the
updater, leases held by this deployment's workers), and sessions are short-term memory that
expires on its own, so they are neither read nor written. The agents' documents are, and the
LangGraph store's items with their history.
Every tenant's rows are, so on PostgreSQL both directions run on the operator's connection
(``operator.py``): the application's role would read and write only the identity it set.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import (
    JSON,
    Column,
    ColumnElement,
    Connection,
    DateTime,
    Engine,
    LargeBinary,
    Table,
    Text,
    bindparam,
    cast,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.engine import Row

from memstore.errors import BackupError
from memstore.storage.sql.engine import SQLITE_WRITE_OPTION
from memstore.storage.sql.maintenance.operator import operator_engine
from memstore.storage.sql.schema.models import (
    agent_document_versions_table,
    agent_documents_table,
    embeddings_table,
    erasures_table,
    facts_table,
    grants_table,
    history_table,
    queue_table,
    relations_table,
    scopes_table,
    sections_table,
    store_item_history_table,
    store_items_table,
    tags_table,
)
from memstore.storage.sql.search.embeddings import vector_matrix, vector_parameter

# Parents before children, so a restore satisfies every foreign key as it goes.
BACKUP_TABLES: tuple[Table, ...] = (
    scopes_table,
    sections_table,
    facts_table,
    grants_table,
    tags_table,
    relations_table,
    embeddings_table,
    history_table,
    erasures_table,
    agent_documents_table,
    agent_document_versions_table,
    store_items_table,
    store_item_history_table,
)
BATCH_ROWS = 1000
"""Rows read or written per round trip: what a backup or restore holds in memory at once."""
_VECTOR_DTYPE = np.dtype("<f4")
_WAITING_STATES = ("pending", "leased", "dead")


def column_names(table: Table) -> list[str]:
    return [column.name for column in table.columns]


@contextmanager
def read_snapshot(engine: Engine) -> Iterator[Connection]:
    """One read transaction that sees a single instant of the whole database, whatever writers do.

    PostgreSQL: REPEATABLE READ. SQLite: a deferred transaction, whose first read fixes its
    snapshot (WAL), so counts and rows agree and writers are never blocked.
    """
    with operator_engine(engine, "backup").connect() as conn:
        if engine.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            yield conn


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """One write transaction (``BEGIN IMMEDIATE`` on SQLite): a restore lands whole or not at all."""
    with operator_engine(engine, "restore").connect() as conn:
        conn.execution_options(**{SQLITE_WRITE_OPTION: True})
        with conn.begin():
            yield conn


def count_rows(conn: Connection) -> dict[str, int]:
    """Rows per backed-up table."""
    return {
        table.name: int(conn.execute(select(func.count()).select_from(table)).scalar_one())
        for table in BACKUP_TABLES
    }


def queued_conversations(conn: Connection) -> int:
    """Conversations in the durable queue not yet done: what a backup leaves out."""
    waiting = select(func.count()).select_from(queue_table).where(queue_table.c.state.in_(_WAITING_STATES))
    return int(conn.execute(waiting).scalar_one())


def dump_rows(conn: Connection, table: Table) -> Iterator[list[Any]]:
    """``table``'s rows in primary-key order, each a list of encoded values in ``column_names`` order.

    Streamed (a server-side cursor on PostgreSQL), ``BATCH_ROWS`` at a time.
    """
    dialect = conn.dialect.name
    query = select(*(_readable(column, dialect) for column in table.columns)).order_by(*table.primary_key)
    encoders = [(index, _encoder(column, dialect)) for index, column in enumerate(table.columns)]
    special = [(index, encode) for index, encode in encoders if encode is not None]
    for row in conn.execution_options(yield_per=BATCH_ROWS).execute(query):
        values = list(row)
        for index, encode in special:
            values[index] = encode(values[index], row)
        yield values


def insert_rows(
    conn: Connection, table: Table, columns: Sequence[str], rows: Iterable[Sequence[Any]]
) -> None:
    """Insert rows as ``dump_rows`` encoded them (values in ``columns`` order), streaming.

    PostgreSQL takes them by COPY, about three times the rate of batched INSERTs; SQLite by
    INSERTs of ``BATCH_ROWS`` rows. Either way triggers and foreign keys apply as to any write.
    """
    if list(columns) != column_names(table):
        expected = column_names(table)
        raise BackupError(f"the backup's {table.name} has columns {list(columns)}, not {expected}")
    decoded = _decoded(table, rows, conn.dialect.name)
    if conn.dialect.name == "postgresql":
        _copy(conn, table, decoded)
    else:
        _insert(conn, table, decoded)


def _decoded(table: Table, rows: Iterable[Sequence[Any]], dialect: str) -> Iterator[list[Any]]:
    width = len(table.columns)
    decoders = [(index, _decoder(column, dialect)) for index, column in enumerate(table.columns)]
    special = [(index, decode) for index, decode in decoders if decode is not None]
    for row in rows:
        if len(row) != width:
            raise BackupError(f"a row of {table.name} in the backup has {len(row)} values, not {width}")
        values = list(row)
        try:
            for index, decode in special:
                values[index] = decode(values[index])
        except (ValueError, TypeError) as exc:  # binascii.Error is a ValueError
            raise BackupError(f"a row of {table.name} in the backup does not fit its columns: {exc}") from exc
        yield values


def _copy(conn: Connection, table: Table, rows: Iterator[list[Any]]) -> None:
    """COPY on the connection's own driver connection, so it is part of the restore's transaction."""
    quote = conn.dialect.identifier_preparer.quote
    names = ", ".join(quote(column.name) for column in table.columns)
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    with cursor, cursor.copy(f"COPY {quote(table.name)} ({names}) FROM STDIN") as copy:
        for values in rows:
            copy.write_row(values)


def _insert(conn: Connection, table: Table, rows: Iterator[list[Any]]) -> None:
    names = [column.name for column in table.columns]
    statement = insert(table).values({column.name: _writable(column) for column in table.columns})
    batch: list[dict[str, Any]] = []
    for values in rows:
        batch.append({f"b_{name}": value for name, value in zip(names, values, strict=True)})
        if len(batch) == BATCH_ROWS:
            conn.execute(statement, batch)
            batch = []
    if batch:
        conn.execute(statement, batch)


def delete_all(conn: Connection) -> None:
    """Empty every backed-up table, children first (the queue's tables are left alone)."""
    for table in reversed(BACKUP_TABLES):
        conn.execute(delete(table))


def reset_sequences(conn: Connection) -> None:
    """PostgreSQL: move each id sequence past the restored ids, so the next insert does not collide.

    SQLite needs nothing: a rowid without AUTOINCREMENT continues from the largest one stored.
    """
    if conn.dialect.name != "postgresql":
        return
    for table in BACKUP_TABLES:
        column = table.autoincrement_column
        if column is not None:
            sequence = func.pg_get_serial_sequence(table.name, column.name)
            highest = func.max(column)
            conn.execute(select(func.setval(sequence, highest)).having(highest.is_not(None)))


def _readable(column: Column[Any], dialect: str) -> ColumnElement[Any]:
    if isinstance(column.type, JSON):
        return cast(column, Text).label(column.name)
    if isinstance(column.type, LargeBinary):  # a vector: ``array_send``'s binary array on PostgreSQL
        return (func.array_send(column) if dialect == "postgresql" else column).label(column.name)
    return column


def _writable(column: Column[Any]) -> ColumnElement[Any]:
    """SQLite's bound value for ``column``: JSON as the text it was read as (SQLite stores JSON as
    text; the column's own type would encode the text again, and a CAST to JSON means NUMERIC)."""
    return bindparam(f"b_{column.name}", type_=Text if isinstance(column.type, JSON) else column.type)


def _encoder(column: Column[Any], dialect: str) -> Callable[[Any, Row[Any]], Any] | None:
    """How a value read by ``_readable`` becomes JSON; ``None`` when it already is."""
    if isinstance(column.type, DateTime):
        return lambda value, _row: None if value is None else _utc(value).isoformat()
    if isinstance(column.type, LargeBinary):  # a vector of ``dimension`` float32 values, or none
        return lambda value, row: (
            None
            if value is None
            else base64.b64encode(
                vector_matrix([value], row.dimension, dialect)[0].astype(_VECTOR_DTYPE).tobytes()
            ).decode("ascii")
        )
    return None


def _decoder(column: Column[Any], dialect: str) -> Callable[[Any], Any] | None:
    """How an encoded value becomes what the column takes; ``None`` when it already is."""
    if isinstance(column.type, DateTime):
        return lambda value: None if value is None else _utc(datetime.fromisoformat(value))
    if isinstance(column.type, LargeBinary):
        return lambda value: None if value is None else vector_parameter(dialect, _vector(value))
    return None


def _vector(encoded: str) -> np.ndarray:
    raw = base64.b64decode(encoded, validate=True)
    if len(raw) % _VECTOR_DTYPE.itemsize:
        raise BackupError("a vector in the backup is not a whole number of float32 values")
    return np.frombuffer(raw, dtype=_VECTOR_DTYPE)


def _utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; memstore writes UTC everywhere, so naive means UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
