"""Engines for the SQL provider: one per URL per process, configured per dialect.

SQLite: WAL, ``busy_timeout`` and foreign keys on every connection, and transactions that
we BEGIN ourselves so writers can take the lock up front (``BEGIN IMMEDIATE``) instead of
failing to upgrade a read lock; a writer may bring its own busy timeout
(``SQLITE_BUSY_TIMEOUT_OPTION``). PostgreSQL: psycopg 3, and no ``pool_pre_ping``: a checkout costs
no round trip. A pooled connection the server closed (a restart, ``pg_terminate_backend``, an idle
timeout, a proxy) has its goodbye waiting on the socket, which the checkout reads without sending
anything (``driver.closed_by_server``) and replaces the connection; one that dies later, or silently,
fails its first statement, and the SQL provider's reads and saves retry once on a new connection
(``documents/retry.py``, docs/performance.md "PostgreSQL without pool_pre_ping").
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import logging
import os
import re
import sqlite3
import threading
import weakref
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.connectors.asyncio import AsyncAdapt_dbapi_connection
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    StatementError,
)
from sqlalchemy.exc import TimeoutError as SATimeoutError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import await_only

from memstore.async_face import running_loop
from memstore.config import MemoryConfig
from memstore.errors import ConfigError, StorageSetupError
from memstore.storage.data_dir import data_dir_of
from memstore.storage.sql.driver import closed_by_server, driver_rows

SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_SECONDS = 10
"""Engines are built with ``hide_parameters``: a failed statement's error (and so every log line
that prints it) never carries the values bound to it, which are users' ids and words."""
DEFAULT_SQLITE_FILE = "memory.db"
PREPARE_THRESHOLD_OPTION = "prepare_threshold"
"""A PostgreSQL URL's query option that memstore, not libpq, reads (``prepare_threshold``)."""
PSYCOPG_PREPARE_THRESHOLD = 5
# Execution option: a connection carrying it begins its transaction with BEGIN IMMEDIATE.
SQLITE_WRITE_OPTION = "memstore_sqlite_write"
# Execution option: how long (ms) that BEGIN IMMEDIATE waits for another writer; default above.
SQLITE_BUSY_TIMEOUT_OPTION = "memstore_sqlite_busy_timeout_ms"

# In text that is not a URL: "scheme://user:<this part>@host".
_PASSWORD_LIKE = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
# A quoted value in a driver's message ('invalid input syntax for type integer: "abc"').
_QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")

logger = logging.getLogger(__name__)

_engines: dict[tuple[int, str], Engine] = {}
_engines_lock = threading.Lock()
_loop_engines: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncEngine]] = (
    weakref.WeakKeyDictionary()
)
"""The async face's engines (``engine_for``): per loop, since an async driver's connections belong
to the loop that opened them."""
_loop_faces: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Engine, Engine]] = (
    weakref.WeakKeyDictionary()
)
"""Per loop, each sync engine (an option engine too: the autocommit reader) to its async-face twin."""
_typed: dict[URL, str] = {}
"""Each URL ``normalize_url`` returned, to the text it was last made from (for ``mask_url``)."""


def database_url_from_config(config: MemoryConfig) -> str:
    """``database_url`` when set, else the embedded SQLite file inside ``data_dir``."""
    if config.database_url:
        return config.database_url
    return f"sqlite:///{data_dir_of(config) / DEFAULT_SQLITE_FILE}"


def operator_url_from_config(config: MemoryConfig) -> str:
    """``operator_database_url`` when set, else the application's URL (``database_url_from_config``)."""
    return config.operator_database_url or database_url_from_config(config)


def mask_url(url: str | URL) -> str:
    """The URL with any password replaced by ``***``: the only form that may reach logs or output.

    A URL given as text keeps the form the user typed (only the password is replaced), so an
    error names exactly what is in their configuration. So does a URL object ``normalize_url``
    made (an engine's ``url``): it is shown as the text it was made from, not as
    ``postgresql+psycopg://`` with its query reordered. Text that does not even parse as a URL
    is shown as it is, except for anything between ``user:`` and ``@``.
    """
    if isinstance(url, URL):
        typed = _typed.get(url)
        if typed is None:
            return url.render_as_string(hide_password=True)
        url = typed
    try:
        password = make_url(url).password
    except Exception:
        return _PASSWORD_LIKE.sub(r"\1***@", url)
    if password is None:
        return url
    secret = str(password)
    for form in (quote(secret, safe=""), quote(secret), secret):
        if f":{form}@" in url:
            return url.replace(f":{form}@", ":***@")
    return make_url(url).render_as_string(hide_password=True)


def normalize_url(url: str | URL) -> URL:
    """Pin PostgreSQL URLs to psycopg 3 and reject dialects memstore does not support."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise ConfigError(f"database_url {mask_url(url)!r} is not a valid SQLAlchemy URL") from exc
    backend = parsed.get_backend_name()
    if backend not in ("postgresql", "sqlite"):
        raise ConfigError(f"database_url {mask_url(url)!r}: only sqlite and postgresql are supported")
    normalized = parsed.set(drivername="postgresql+psycopg") if backend == "postgresql" else parsed
    if PREPARE_THRESHOLD_OPTION in parsed.query:
        if backend != "postgresql":
            raise ConfigError(f"database_url {mask_url(url)!r}: {PREPARE_THRESHOLD_OPTION} is for PostgreSQL")
        prepare_threshold(parsed)  # raises ConfigError on a bad value
    if isinstance(url, str):
        _typed[normalized] = url
    return normalized


def prepare_threshold(url: URL) -> int | None:
    """psycopg's ``prepare_threshold`` for ``url``: its ``?prepare_threshold=`` (``none`` turns server-side
    prepared statements off, which a transaction pooler such as PgBouncer before 1.21 needs: a statement
    prepared on one server connection is missing on the next), else psycopg's default of 5."""
    value = url.query.get(PREPARE_THRESHOLD_OPTION, str(PSYCOPG_PREPARE_THRESHOLD))
    text = value if isinstance(value, str) else ",".join(value)
    if text.lower() == "none":
        return None
    if text.isascii() and text.isdigit() and len(text) <= 6:
        return int(text)
    raise ConfigError(
        f"database_url {mask_url(url)!r}: {PREPARE_THRESHOLD_OPTION} must be 'none' or a whole number, "
        f"not {text[:32]!r}"
    )


def get_engine(url: str | URL) -> Engine:
    """The process's engine for ``url``; a forked child builds its own pool instead of sharing sockets."""
    normalized = normalize_url(url)
    key = (os.getpid(), normalized.render_as_string(hide_password=False))
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _build_engine(normalized)
            _engines[key] = engine
        return engine


def engine_for(engine: Engine) -> Engine:
    """``engine`` as the calling face uses it: itself on the sync face; on the async face
    (``memstore.async_face``), the synchronous face of an async-driver engine for the same URL, with
    the same execution options, whose connections belong to the running loop."""
    loop = running_loop()
    if loop is None or engine.dialect.is_async:
        return engine
    with _engines_lock:
        faces = _loop_faces.get(loop)
        face = None if faces is None else faces.get(engine)
        if face is not None:
            return face
        if loop not in _loop_engines:
            _forget_closed_loops()
        engines = _loop_engines.setdefault(loop, {})
        url = engine.url.render_as_string(hide_password=False)
        if url not in engines:
            engines[url] = _build_async_engine(engine.url)
        face = engines[url].sync_engine
        options = engine.get_execution_options()
        if options:
            face = face.execution_options(**options)
        _loop_faces.setdefault(loop, {})[engine] = face
        return face


def _forget_closed_loops() -> None:
    """Drop the engines of loops that closed without ``dispose_loop_engines`` (``asyncio.run`` per
    call): their connections are finalised once unreferenced (aiosqlite's threads stop then)."""
    for closed in [loop for loop in _loop_engines if loop.is_closed()]:
        _loop_engines.pop(closed, None)
        _loop_faces.pop(closed, None)


async def dispose_loop_engines() -> None:
    """Close the running loop's async-face pools (a server's shutdown, a test's end)."""
    loop = asyncio.get_running_loop()
    with _engines_lock:
        engines = list(_loop_engines.pop(loop, {}).values())
        _loop_faces.pop(loop, None)
    for engine in engines:
        await engine.dispose()


def dispose_engines() -> None:
    """Close every pool this process opened (tests, CLI exit)."""
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
        _forget_closed_loops()
    for engine in engines:
        engine.dispose()


def _postgresql_options(url: URL) -> dict[str, Any]:
    # Without a connect timeout a host that stopped answering stalls the queue worker for
    # minutes; the URL's own ?connect_timeout= wins.
    connect_args = {} if "connect_timeout" in url.query else {"connect_timeout": PG_CONNECT_TIMEOUT_SECONDS}
    return {
        "pool_size": 5,
        "max_overflow": 10,
        "connect_args": connect_args,
        "hide_parameters": True,
    }


def _configure_postgresql(engine: Engine) -> Engine:
    """Hand ``?prepare_threshold=`` to psycopg as the connection argument it is; libpq, which gets
    the URL's other query values, would refuse it as an unknown option."""
    threshold = prepare_threshold(engine.url)

    @event.listens_for(engine, "do_connect")
    def _on_connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        cparams.pop(PREPARE_THRESHOLD_OPTION, None)
        cparams["prepare_threshold"] = threshold

    event.listen(engine.pool, "checkout", closed_by_server)
    return engine


def _build_engine(url: URL) -> Engine:
    if url.get_backend_name() == "postgresql":
        return _configure_postgresql(create_engine(url, **_postgresql_options(url)))
    _create_sqlite_folder(url)
    engine = create_engine(url, connect_args={"check_same_thread": False}, hide_parameters=True)
    _configure_sqlite(engine)
    return engine


def _build_async_engine(url: URL) -> AsyncEngine:
    """The async face's engine: psycopg's async connection, or aiosqlite, configured as above."""
    if url.get_backend_name() == "postgresql":
        engine = create_async_engine(url, **_postgresql_options(url))
        _configure_postgresql(engine.sync_engine)
        return engine
    if (url.database or ":memory:") == ":memory:" or "mode=memory" in (url.database or ""):
        raise ConfigError(
            "an in-memory SQLite database is private to its connection: the async face cannot reach "
            "it; use a SQLite file (database_url sqlite:///path/memory.db)"
        )
    _create_sqlite_folder(url)
    engine = create_async_engine(
        url.set(drivername="sqlite+aiosqlite"),
        connect_args={"check_same_thread": False},
        hide_parameters=True,
    )
    _configure_sqlite(engine.sync_engine)
    return engine


def _create_sqlite_folder(url: URL) -> None:
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        folder = Path(database).expanduser().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageSetupError(
                f"cannot create the SQLite database's folder {folder}: {exc.strerror or exc}"
            ) from exc


def load_sqlite_vec(dbapi_connection: Any) -> None:
    """Load sqlite-vec for semantic search; without it (not installed, or a Python built without
    extension loading) search uses the exact scan, and ``memstore embed --status`` says so. On the
    async face the connection is SQLAlchemy's adapter of aiosqlite's, whose calls are awaited."""
    extension = sqlite_vec_path()
    if extension is None:
        logger.debug("sqlite-vec is not installed; semantic search scans exactly")
        return
    try:
        if isinstance(dbapi_connection, AsyncAdapt_dbapi_connection):  # the async face: aiosqlite
            driver = dbapi_connection._connection
            await_only(driver.enable_load_extension(True))
            try:
                await_only(driver.load_extension(extension))
            finally:
                await_only(driver.enable_load_extension(False))
            return
        dbapi_connection.enable_load_extension(True)
        try:
            dbapi_connection.load_extension(extension)
        finally:
            dbapi_connection.enable_load_extension(False)
    except (AttributeError, sqlite3.Error) as exc:
        logger.debug("sqlite-vec not loaded, semantic search scans exactly: %s", exc)


@functools.cache
def sqlite_vec_path() -> str | None:
    """sqlite-vec's loadable extension (``vec0`` in its package folder, where its own
    ``loadable_path()`` looks), found without importing its module: that imports numpy, 0.1-0.3 s
    of every SQLite connection's first use in a process that never touches a vector."""
    spec = importlib.util.find_spec("sqlite_vec")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.normpath(os.path.join(next(iter(spec.submodule_search_locations)), "vec0"))


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the driver so BEGIN is ours to choose.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()
        load_sqlite_vec(dbapi_connection)

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # On the driver's cursor (``driver_rows``): SQLAlchemy's execution of BEGIN cost more than it.
        options = connection.get_execution_options()
        if not options.get(SQLITE_WRITE_OPTION, False):
            driver_rows(connection, "BEGIN", {})
            return
        # Per write, so a pooled connection never keeps another writer's timeout; on the driver
        # connection, and only when it changes, since it is connection state rather than a statement.
        busy_ms = int(options.get(SQLITE_BUSY_TIMEOUT_OPTION, SQLITE_BUSY_TIMEOUT_MS))
        pooled = connection.connection
        if pooled.info.get(SQLITE_BUSY_TIMEOUT_OPTION) != busy_ms:
            cursor = pooled.dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cursor.close()
            pooled.info[SQLITE_BUSY_TIMEOUT_OPTION] = busy_ms
        driver_rows(connection, "BEGIN IMMEDIATE", {})


def driver_execute(conn: Connection, statement: str) -> list[Any]:
    """``statement`` run on the DBAPI connection itself, outside SQLAlchemy's transaction handling
    (a PRAGMA, VACUUM), and its rows; on the async face that connection is SQLAlchemy's adapter of
    the async driver's, so this works on both faces."""
    dbapi_connection = conn.connection.dbapi_connection
    assert dbapi_connection is not None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(statement)
        return list(cursor.fetchall()) if cursor.description else []
    finally:
        cursor.close()


def is_outage(exc: BaseException) -> bool:
    """Errors that say "the database is not reachable right now", as opposed to "this write is wrong".

    That includes a lock or statement timeout (PostgreSQL 55P03 and 57014, SQLite's "database is
    locked"): all OperationalErrors, retried later for that scope alone.
    """
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError)
    return isinstance(exc, SATimeoutError | DisconnectionError)


def is_refused_value(exc: BaseException) -> bool:
    """Errors that say "this write's values are wrong": retrying the same values fails again.

    A value the server will not store (PostgreSQL's NUL in text or JSON, an invalid escape, a
    constraint) or one the driver cannot send (an encoding or serialisation error raised before
    the statement reached the server). The opposite of an outage: only that write is at fault.
    """
    if isinstance(exc, DataError | IntegrityError):
        return True
    if isinstance(exc, StatementError) and not isinstance(exc, DBAPIError):
        return True
    return isinstance(exc, ValueError | TypeError | UnicodeError)


def describe_db_error(exc: BaseException, *, url: str | None = None) -> str:
    """A database error as a log line or a message may carry it: nothing of the data it was about.

    PostgreSQL puts the offending value in DETAIL and CONTEXT lines (``JSON data, line 1:
    {"content": "hello...``) and sometimes quotes it in the first line; neither may reach a log,
    which an operator reads without the right to read memory. So a refused write keeps its
    class, SQLSTATE and first line with quoted text replaced by ``"…"``. An outage's message
    names a host, never a value, and is kept whole (libpq's hint on its second line helps).
    """
    message = _described(exc)
    try:
        password = make_url(url).password if url else None
    except Exception:
        password = None
    # A driver's message may quote the URL it was given: never its password.
    return message.replace(str(password), "***") if password else message


def _described(exc: BaseException) -> str:
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    message = str(cause).strip()
    if is_outage(exc):
        return message or type(cause).__name__
    first = _QUOTED.sub('"…"', message.splitlines()[0]) if message else ""
    code = getattr(cause, "sqlstate", None)
    label = type(cause).__name__ + (f" {code}" if code else "")
    return f"{label}: {first}" if first else label
