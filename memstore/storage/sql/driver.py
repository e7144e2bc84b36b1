"""The DBAPI connection under SQLAlchemy's: the checkout's liveness check and the lean statement path.

``closed_by_server`` is the PostgreSQL pool's checkout listener (``engine.py``), which replaced
``pool_pre_ping``; ``driver_rows`` runs a statement on the driver's own cursor, for the few
statements of the cold load and the save whose SQLAlchemy overhead outweighed their cost.
"""

from __future__ import annotations

import select
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Connection, Dialect, Insert, Select, Update
from sqlalchemy.exc import DisconnectionError

_IDLE = 0  # libpq's PQTRANS_IDLE: no transaction, no query in flight
_OK = 0  # libpq's CONNECTION_OK


def closed_by_server(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """Refuse a pooled connection the server has closed, without a round trip: the pool then
    replaces it (``DisconnectionError`` in a checkout listener). A server that ends a session sends
    its reason and closes the socket, so an idle connection with bytes to read is read (libpq
    consumes them without blocking) and kept only if it is still up. A connection that merely went
    silent (a network cut) reads as alive here, as it did to a pre-ping until TCP gave up."""
    pgconn = getattr(record.driver_connection, "pgconn", None)
    if pgconn is None:
        return
    try:
        for _ in range(2):  # the reason, then the end of the stream
            if pgconn.status != _OK or pgconn.transaction_status != _IDLE:
                break
            if not _readable(pgconn.socket):
                return
            pgconn.consume_input()
    except Exception as exc:  # libpq reports the closed socket as an error of its own
        raise DisconnectionError(f"the server closed a pooled connection: {exc}") from exc
    if pgconn.status == _OK and pgconn.transaction_status == _IDLE:
        return
    raise DisconnectionError("the server closed a pooled connection")


def _readable(fd: int) -> bool:
    """Whether ``fd`` has something to read (or its end) right now; never waits."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # pragma: no cover - Windows has no poll


def driver_rows(conn: Connection, statement: str, parameters: Mapping[str, Any]) -> Sequence[Any]:
    """The rows of ``statement`` (none for a write), run on the DBAPI cursor of ``conn``'s connection, in
    ``conn``'s transaction if one is open, without SQLAlchemy's per-statement work (a few times the
    cost of SQLite running the statement). A failure is raised as ``conn`` would raise it: wrapped in
    SQLAlchemy's ``DBAPIError``, the connection invalidated when it is gone. ``statement`` is in the
    driver's own parameter style (named: ``:name`` on SQLite, ``%(name)s`` on psycopg).

    When something listens to the engine's statements (a tracer such as OpenTelemetry's, a test),
    the statement goes through ``exec_driver_sql`` instead, so they see it as any other."""
    dispatch = conn.dispatch
    if dispatch.before_cursor_execute or dispatch.after_cursor_execute:
        result = conn.exec_driver_sql(statement, dict(parameters))
        return result.all() if result.returns_rows else []
    dbapi_connection = conn.connection.dbapi_connection
    assert dbapi_connection is not None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(statement, parameters)
        return cursor.fetchall() if cursor.description else []
    except Exception as exc:
        conn._handle_dbapi_exception(exc, statement, parameters, cursor, None)
    finally:
        cursor.close()


class DriverStatement:
    """A Core statement run like ``driver_rows``: compiled once per dialect (and, for an INSERT, per set
    of columns), its parameters converted by SQLAlchemy's own bind processors, so the database gets
    exactly what ``conn.execute`` would send it, for a fraction of its cost. Rows come back as the
    driver gives them (no result processing: SQLite's timestamps are text). A list of parameter sets
    is one ``executemany``."""

    def __init__(self, statement: Select[Any] | Insert | Update) -> None:
        self._statement = statement
        self._compiled: dict[tuple[str, tuple[str, ...]], tuple[str, Callable[[Mapping[str, Any]], Any]]] = {}

    def run(self, conn: Connection, parameters: Mapping[str, Any] | list[Mapping[str, Any]]) -> Sequence[Any]:
        dispatch = conn.dispatch
        if dispatch.before_cursor_execute or dispatch.after_cursor_execute:
            result = conn.execute(self._statement, parameters)
            return result.all() if result.returns_rows else []
        first: Mapping[str, Any] = parameters[0] if isinstance(parameters, list) else parameters
        key = (conn.dialect.name, tuple(first))
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = self._compile(conn.dialect, key[1])
        sql, convert = compiled
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None
        cursor = dbapi_connection.cursor()
        try:
            if isinstance(parameters, list):
                cursor.executemany(sql, list(map(convert, parameters)))
                return []
            cursor.execute(sql, convert(parameters))
            return cursor.fetchall() if cursor.description else []
        except Exception as exc:
            conn._handle_dbapi_exception(exc, sql, parameters, cursor, None)
        finally:
            cursor.close()

    def _compile(
        self, dialect: Dialect, keys: tuple[str, ...]
    ) -> tuple[str, Callable[[Mapping[str, Any]], Any]]:
        compiled = self._statement.compile(dialect=dialect, column_keys=list(keys))
        # One processor per parameter: none of these statements binds a tuple.
        processors = cast(Mapping[str, Callable[[Any], Any]], compiled._bind_processors)
        names = compiled.positiontup

        def convert(parameters: Mapping[str, Any]) -> Any:
            values = compiled.construct_params(parameters, _check=False)
            if names is None:  # named (psycopg)
                return {
                    name: processors[name](value) if name in processors else value
                    for name, value in values.items()
                }
            return [processors[name](values[name]) if name in processors else values[name] for name in names]

        return compiled.string, convert
