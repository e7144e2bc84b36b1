"""Alembic, driven from code: find the shipped revision scripts and move a database between revisions.

The revision chain in ``alembic/`` is the only source of DDL. Every online migration runs in one
transaction that first takes a database-wide lock (``BEGIN IMMEDIATE`` on SQLite, a transaction-level
advisory lock on PostgreSQL), so gateway replicas that start together migrate exactly once and the
others find the schema already at head when the lock is theirs.

Alembic is imported by the functions that need it, never at module level: a start against a
database at head (``prepare_database``) reads the head and the database's revision through
``schema.revisions`` and imports no Alembic (0.2 s of CPU per process otherwise).
"""

from __future__ import annotations

import functools
import io
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import URL

from memstore.async_face import held
from memstore.errors import MigrationError, SchemaNotReadyError, StorageSetupError
from memstore.storage.sql.engine import (
    SQLITE_WRITE_OPTION,
    driver_execute,
    get_engine,
    mask_url,
    normalize_url,
)
from memstore.storage.sql.schema.partition_layout import Layout
from memstore.storage.sql.schema.revisions import scanned_head, stored_revision

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import Script, ScriptDirectory

logger = logging.getLogger(__name__)

Dialect = Literal["sqlite", "postgresql"]
DIALECTS: tuple[Dialect, ...] = ("sqlite", "postgresql")

# Key of the PostgreSQL advisory lock every memstore process takes before migrating ("memstore").
PG_MIGRATION_LOCK_KEY = 0x6D656D73746F7265
# Offline rendering needs only a dialect, never a connection.
_OFFLINE_URLS: dict[Dialect, str] = {"sqlite": "sqlite://", "postgresql": "postgresql+psycopg://"}


def script_location() -> Path:
    """Where ``env.py`` and ``versions/`` live: inside the installed wheel, else the checkout's ``alembic/``.

    The wheel carries the repository's ``alembic/`` as ``memstore/_alembic``; an editable install
    has no such directory, so the checkout next to the package is used instead.
    """
    packaged = resources.files("memstore").joinpath("_alembic")
    if isinstance(packaged, Path) and (packaged / "env.py").is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[4] / "alembic"
    if (checkout / "env.py").is_file():
        return checkout
    raise MigrationError("memstore's migration scripts are missing: neither memstore/_alembic nor alembic/")


def alembic_config(
    url: str | URL | None = None, *, connection: Connection | None = None, output: io.StringIO | None = None
) -> Config:
    """An Alembic config built in code, so nothing depends on the cwd or on alembic.ini.

    The URL and connection travel in ``attributes`` rather than ini options: ini values are
    %-interpolated, which would mangle passwords containing ``%``.
    """
    from alembic.config import Config

    config = Config(output_buffer=output)
    config.set_main_option("script_location", str(script_location()).replace("%", "%%"))
    if url is not None:
        config.attributes["url"] = normalize_url(url)
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def _scripts() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def _chain_errors() -> tuple[type[Exception], ...]:
    """Alembic's errors for a broken chain or an unknown revision, imported only once one is raised
    (an ``except`` clause evaluates its expression only when an exception reaches it)."""
    from alembic.script.revision import RevisionError
    from alembic.util import CommandError

    return CommandError, RevisionError


def head() -> str:
    """The single head revision of the shipped chain: read from the scripts' ``revision`` lines
    (``revisions.scanned_head``), else from Alembic, whose errors name what is wrong."""
    scanned = scanned_head(script_location() / "versions")
    if scanned is not None:
        return scanned
    try:
        revision = _scripts().get_current_head()
    except _chain_errors() as exc:
        raise MigrationError(f"the revision chain is broken: {exc}") from exc
    if revision is None:
        raise MigrationError("the revision chain is empty")
    return revision


def history() -> list[Script]:
    """Every revision, newest first."""
    try:
        return list(_scripts().walk_revisions())
    except _chain_errors() as exc:
        raise MigrationError(f"the revision chain is broken: {exc}") from exc


def current(url: str | URL) -> str | None:
    """The database's revision; ``None`` for an empty database (or a SQLite file that does not exist:
    ``doctor`` asks without creating one; ``require_database`` tells the two apart)."""
    normalized = normalize_url(url)
    if normalized.get_backend_name() == "sqlite" and not _sqlite_file_exists(normalized):
        return None
    with get_engine(normalized).connect() as connection:
        return stored_revision(connection)


def require_database(url: str | URL) -> None:
    """Refuse a SQLite URL whose file does not exist, where opening it would create an empty one.

    Reading its revision would answer ``<base>``, and stamping or running a worker on it would
    leave an empty database behind a typo; PostgreSQL refuses a missing database by itself.
    """
    normalized = normalize_url(url)
    if normalized.get_backend_name() == "sqlite" and not _sqlite_file_exists(normalized):
        raise StorageSetupError(
            f"no database at {mask_url(normalized)}: the SQLite file does not exist "
            "(check the path; `memstore db upgrade` creates it)"
        )


def current_of(engine: Engine) -> str | None:
    """The revision of the database ``engine`` serves (a readiness probe's question)."""
    with engine.connect() as connection:
        return stored_revision(connection)


def upgrade(url: str | URL, revision: str = "head") -> tuple[str | None, str | None]:
    """Upgrade under the migration lock; returns the revisions before and after."""
    from alembic import command

    return _migrate(get_engine(url), command.upgrade, revision)


def downgrade(url: str | URL, revision: str) -> tuple[str | None, str | None]:
    """Downgrade under the migration lock (``"base"`` drops every memstore table)."""
    from alembic import command

    return _migrate(get_engine(url), command.downgrade, revision)


def stamp(url: str | URL, revision: str) -> tuple[str | None, str | None]:
    """Record ``revision`` as the database's revision without running any DDL (under the lock)."""
    from alembic import command

    require_database(url)
    return _migrate(get_engine(url), command.stamp, revision)


def heads() -> list[Script]:
    """The head revisions of the shipped chain (one, unless the chain is broken)."""
    return [script for script in history() if script.is_head]


@dataclass(frozen=True)
class SchemaCheck:
    """What ``memstore db check`` found: the revision, and where the tables differ from the models."""

    current: str | None
    head: str
    differences: tuple[str, ...]

    @property
    def at_head(self) -> bool:
        return self.current == self.head


def check(url: str | URL) -> SchemaCheck:
    """Is the database at head, and does its schema match memstore's models (``alembic check``)?

    The comparison runs only at head: behind it, differences are the pending migrations. Tables
    memstore has no model of are left out: in a shared database they are another application's.
    It reads the catalog and writes nothing.
    """
    from alembic import command
    from alembic.util import AutogenerateDiffsDetected

    require_database(url)
    engine = get_engine(url)
    target = head()
    with engine.connect() as connection:
        found = stored_revision(connection)
        if found != target:
            return SchemaCheck(found, target, ())
        layout = Layout.read(connection)
        config = alembic_config(connection=connection)
        config.stdout = io.StringIO()  # Alembic's "No new upgrade operations detected."
        try:
            command.check(config)
        except AutogenerateDiffsDetected as exc:
            diffs = getattr(exc, "diffs", None) or [str(exc)]
            described = (
                _describe_diff(diff)
                for diff in diffs
                if not (_is_foreign_table(diff) or layout.explains(diff))  # db partition's by design
            )
            # dict: Alembic and memstore's index comparator may both report one index.
            return SchemaCheck(found, target, tuple(dict.fromkeys(described)))
        except _chain_errors() as exc:
            raise MigrationError(str(exc)) from exc
    return SchemaCheck(found, target, ())


def schema_not_ready(where: str, found: str | None, target: str) -> SchemaNotReadyError:
    """The error for a database not at ``target``: upgrade the database, or memstore when it is newer."""
    if found is not None and found not in {script.revision for script in history()}:
        return SchemaNotReadyError(
            f"database {where} is at revision {found}, which this memstore does not know "
            f"(head is {target}): it was migrated by a newer memstore; upgrade memstore"
        )
    return SchemaNotReadyError(
        f"database {where} is at revision {found or '<base> (empty)'}, head is {target}: "
        "run `memstore db upgrade`"
    )


def _is_foreign_table(diff: Any) -> bool:
    return isinstance(diff, tuple) and len(diff) > 0 and diff[0] == "remove_table"


def _describe_diff(diff: Any) -> str:
    """One autogenerate difference as a DBA reads it: ``extra column memory_facts.note``.

    ``missing`` is in memstore's models but not in the database, ``extra`` the reverse.
    """
    if isinstance(diff, list):  # the changes to one column come grouped
        return "; ".join(_describe_diff(item) for item in diff)
    if not isinstance(diff, tuple) or not diff or not isinstance(diff[0], str):
        return str(diff)
    kind, *rest = diff
    action, _, what = kind.partition("_")
    what = {"fk": "foreign key"}.get(what, what)
    if action == "modify" and len(rest) >= 6:
        _schema, table, column, _info, existing, wanted = rest[:6]
        return f"column {table}.{column} {what}: database {existing!r}, models {wanted!r}"
    state = {"add": "missing", "remove": "extra"}.get(action, action)
    if what == "column" and len(rest) >= 3:
        return f"{state} column {rest[1]}.{rest[2].name}"
    thing = rest[0] if rest else None
    table = getattr(thing, "table", None)
    name = getattr(thing, "name", None) or str(thing)
    return f"{state} {what} {table.name}.{name}" if table is not None else f"{state} {what} {name}"


def prepare_database(engine: Engine, *, auto_migrate: bool) -> None:
    """Make sure ``engine``'s schema is at head before the storage uses it.

    SQLite (embedded, one owner) is always migrated. PostgreSQL is shared by many replicas and
    owned by a DBA, so it is only migrated when ``auto_migrate`` is on; otherwise a database
    behind head fails fast with the command to run.
    """
    target = head()
    with engine.connect() as connection:
        found = stored_revision(connection)
    if found == target:
        return
    where = mask_url(engine.url)
    if found is not None and found not in {script.revision for script in history()}:
        raise schema_not_ready(where, found, target)
    if engine.dialect.name == "postgresql" and not auto_migrate:
        raise SchemaNotReadyError(f"{schema_not_ready(where, found, target)} (or set auto_migrate: true)")
    from alembic import command

    logger.info("migrating %s from %s to %s", where, found or "<base>", target)
    _migrate(engine, command.upgrade, "head")


def render_sql(dialect: Dialect, from_rev: str | None = None, to_rev: str = "head") -> str:
    """The offline (``--sql``) script from ``from_rev`` (``None``: empty database) to ``to_rev``.

    A ``to_rev`` older than ``from_rev`` (or ``"base"``) renders the downgrade instead.
    """
    if dialect not in _OFFLINE_URLS:
        raise MigrationError(f"unknown dialect {dialect!r}; choose one of {', '.join(DIALECTS)}")
    from alembic import command

    output = io.StringIO()
    config = alembic_config(_OFFLINE_URLS[dialect], output=output)
    try:
        if from_rev is not None and _is_older(to_rev, than=from_rev):
            command.downgrade(config, f"{from_rev}:{to_rev}", sql=True)
        else:
            command.upgrade(config, f"{from_rev}:{to_rev}" if from_rev else to_rev, sql=True)
    except _chain_errors() as exc:
        raise MigrationError(str(exc)) from exc
    return output.getvalue()


def dialect_of(url: str | URL) -> Dialect:
    """``"sqlite"`` or ``"postgresql"`` for a supported URL (no connection is made)."""
    return "sqlite" if normalize_url(url).get_backend_name() == "sqlite" else "postgresql"


@contextmanager
def migration_connection(engine: Engine) -> Iterator[Connection]:
    """A connection in one transaction that holds the database-wide migration lock; commits on success."""
    if engine.dialect.name != "sqlite":
        with engine.connect() as connection, connection.begin():
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_MIGRATION_LOCK_KEY})
            yield connection
        return
    with engine.connect() as connection:
        # Batch migrations recreate tables; with foreign keys on, dropping the old parent table
        # would cascade-delete child rows. The pragma is a no-op inside a transaction, so set it first.
        _set_sqlite_foreign_keys(connection, enabled=False)
        try:
            connection.execution_options(**{SQLITE_WRITE_OPTION: True})
            with connection.begin():
                yield connection
                violations = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if violations:
                    raise MigrationError(f"migration left dangling foreign keys: {violations[:5]}")
        finally:
            _set_sqlite_foreign_keys(connection, enabled=True)


def _migrate(
    engine: Engine, action: Callable[[Config, str], None], revision: str
) -> tuple[str | None, str | None]:
    try:
        with migration_connection(engine) as connection:
            before = stored_revision(connection)
            action(alembic_config(connection=connection), revision)
            after = stored_revision(connection)
    except _chain_errors() as exc:
        raise MigrationError(str(exc)) from exc
    if before != after:
        logger.info("migrated %s from %s to %s", mask_url(engine.url), before or "<base>", after or "<base>")
    return before, after


def _is_older(revision: str, *, than: str) -> bool:
    """Whether ``revision`` is a strict ancestor of ``than`` (``"base"`` always is)."""
    if revision == "base":
        return True
    scripts = _scripts()
    try:
        target = scripts.get_revision(revision)
        ancestors = {script.revision for script in scripts.walk_revisions("base", than)}
    except _chain_errors() as exc:
        raise MigrationError(str(exc)) from exc
    return target is not None and target.revision != than and target.revision in ancestors


def _sqlite_file_exists(url: URL) -> bool:
    database = url.database or ""
    if not database or database == ":memory:" or database.startswith("file:"):
        return True
    return Path(database).expanduser().exists()


def _set_sqlite_foreign_keys(connection: Connection, *, enabled: bool) -> None:
    driver_execute(connection, f"PRAGMA foreign_keys = {'ON' if enabled else 'OFF'}")


_prepared: set[str] = set()
_prepared_lock = threading.Lock()


def prepare_once(engine: Engine, *, auto_migrate: bool) -> None:
    """``prepare_database`` once per database per process, not once per storage or queue."""
    key = engine.url.render_as_string(hide_password=False)
    with held(_prepared_lock):
        if key in _prepared:
            return
        prepare_database(engine, auto_migrate=auto_migrate)
        _prepared.add(key)
