"""Engines for the SQL provider: one per URL per process, configured per dialect.

SQLite: WAL, ``busy_timeout`` and foreign keys on every connection, and transactions that
we BEGIN ourselves so writers can take the lock up front (``BEGIN IMMEDIATE``) instead of
failing to upgrade a read lock; a writer may bring its own busy timeout
(``SQLITE_BUSY_TIMEOUT_OPTION``). PostgreSQL: psycopg 3 with ``pool_pre_ping``.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
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

from memstore.config import MemoryConfig
from memstore.errors import ConfigError, StorageSetupError
from memstore.storage.data_dir import data_dir_of

SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_SECONDS = 10
"""Engines are built with ``hide_parameters``: a failed statement's error (and so every log line
that prints it) never carries the values bound to it, which are users' ids and words."""
DEFAULT_SQLITE_FILE = "memory.db"
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
    if isinstance(url, str):
        _typed[normalized] = url
    return normalized


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


def dispose_engines() -> None:
    """Close every pool this process opened (tests, CLI exit)."""
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.dispose()


def _build_engine(url: URL) -> Engine:
    if url.get_backend_name() == "postgresql":
        # Without a connect timeout a host that stopped answering stalls the queue worker for
        # minutes; the URL's own ?connect_timeout= wins.
        connect_args = (
            {} if "connect_timeout" in url.query else {"connect_timeout": PG_CONNECT_TIMEOUT_SECONDS}
        )
        return create_engine(
            url,
            pool_pre_ping=True,
            pool_size=5,
            max_overflow=10,
            connect_args=connect_args,
            hide_parameters=True,
        )
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        folder = Path(database).expanduser().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageSetupError(
                f"cannot create the SQLite database's folder {folder}: {exc.strerror or exc}"
            ) from exc
    engine = create_engine(url, connect_args={"check_same_thread": False}, hide_parameters=True)
    _configure_sqlite(engine)
    return engine


def load_sqlite_vec(dbapi_connection: sqlite3.Connection) -> None:
    """Load sqlite-vec for semantic search; without it (a Python built without extension loading)
    search uses the exact scan, and ``memstore embed --status`` says so."""
    try:
        import sqlite_vec

        dbapi_connection.enable_load_extension(True)
        try:
            sqlite_vec.load(dbapi_connection)
        finally:
            dbapi_connection.enable_load_extension(False)
    except (ImportError, AttributeError, sqlite3.Error) as exc:
        logger.debug("sqlite-vec not loaded, semantic search scans exactly: %s", exc)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
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
        options = connection.get_execution_options()
        if not options.get(SQLITE_WRITE_OPTION, False):
            connection.exec_driver_sql("BEGIN")
            return
        # Per write, so a pooled connection never keeps another writer's timeout; on the driver
        # connection, and only when it changes, since it is connection state rather than a statement.
        busy_ms = int(options.get(SQLITE_BUSY_TIMEOUT_OPTION, SQLITE_BUSY_TIMEOUT_MS))
        pooled = connection.connection
        if pooled.info.get(SQLITE_BUSY_TIMEOUT_OPTION) != busy_ms:
            pooled.driver_connection.execute(f"PRAGMA busy_timeout = {busy_ms}")
            pooled.info[SQLITE_BUSY_TIMEOUT_OPTION] = busy_ms
        connection.exec_driver_sql("BEGIN IMMEDIATE")


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


def describe_db_error(exc: BaseException) -> str:
    """A database error as a log line or a message may carry it: nothing of the data it was about.

    PostgreSQL puts the offending value in DETAIL and CONTEXT lines (``JSON data, line 1:
    {"content": "hello...``) and sometimes quotes it in the first line; neither may reach a log,
    which an operator reads without the right to read memory. So a refused write keeps its
    class, SQLSTATE and first line with quoted text replaced by ``"…"``. An outage's message
    names a host, never a value, and is kept whole (libpq's hint on its second line helps).
    """
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    message = str(cause).strip()
    if is_outage(exc):
        return message or type(cause).__name__
    first = _QUOTED.sub('"…"', message.splitlines()[0]) if message else ""
    code = getattr(cause, "sqlstate", None)
    label = type(cause).__name__ + (f" {code}" if code else "")
    return f"{label}: {first}" if first else label
