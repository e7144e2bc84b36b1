"""``memstore db``: create, migrate and inspect the schema with the Alembic revisions shipped in memstore,
and grant the application's PostgreSQL role (``grant-app-role``). Every command runs on the
operator's connection (``operator_database_url``, else ``database_url``): it owns the tables.

Works from an installed wheel, anywhere: no alembic.ini and no checkout needed. URLs are only
ever printed masked, and error messages are scrubbed of the password as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import click
from alembic.util import CommandError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from memstore.cli.confirm import confirm_deletion, echo_listing, yes_option
from memstore.cli.params import not_blank
from memstore.config import get_memory_config
from memstore.errors import MigrationError
from memstore.storage.loader import load_storage_class
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, get_engine, mask_url, operator_url_from_config
from memstore.storage.sql.schema import migrate, roles
from memstore.storage.sql.schema.downgrade_plan import Dropped, plan_downgrade

url_option = click.option(
    "--url",
    metavar="URL",
    callback=not_blank,
    help="SQLAlchemy database URL. Default: operator_database_url, else database_url (from "
    "MEMSTORE_* or the MEMSTORE_CONFIG file), else the embedded SQLite file in data_dir.",
)


@click.group()
def db() -> None:
    """Create, migrate and check the memstore schema (upgrade, downgrade, current, check, stamp, ...)."""
    click.get_current_context().call_on_close(dispose_engines)


@db.command()
@click.argument("revision", default="head")
@url_option
def upgrade(revision: str, url: str | None) -> None:
    """Upgrade the database to REVISION (default: head)."""
    url = _resolve(url)
    with _reporting(url):
        before, after = migrate.upgrade(url, revision)
    click.echo(_moved(url, before, after))


@db.command()
@click.argument("revision")
@url_option
@yes_option
def downgrade(revision: str, url: str | None, yes: bool) -> None:
    """Downgrade the database to REVISION ("base" drops every memstore table).

    First lists (on stderr) the tables, columns and indexes it drops, with the rows holding data
    in each; when any holds data it asks, and needs --yes without a terminal.
    """
    url = _resolve(url)
    with _reporting(url):
        plan = plan_downgrade(url, revision)
    if plan.drops:
        echo_listing(
            f"downgrading {mask_url(url)} from {_label(plan.current)} to {_label(plan.target)} drops:",
            map(_dropped, plan.drops),
        )
    if plan.loses_data:
        confirm_deletion("downgrade", "Drop them, and the data they hold?", yes=yes)
    with _reporting(url):
        before, after = migrate.downgrade(url, plan.target or "base")
    click.echo(_moved(url, before, after))


@db.command()
@url_option
def current(url: str | None) -> None:
    """Show the database's revision."""
    url = _resolve(url)
    with _reporting(url):
        migrate.require_database(url)  # a missing SQLite file is not an empty database
        revision, head = migrate.current(url), migrate.head()
    state = "(head)" if revision == head else f"(head is {head}: run `memstore db upgrade`)"
    click.echo(f"{mask_url(url)}: {_label(revision)} {state}")


@db.command()
@click.argument("revision")
@url_option
def stamp(revision: str, url: str | None) -> None:
    """Record REVISION as the database's revision without running any migration.

    For a schema that is already there but not recorded: tables created by hand or restored from
    a dump without the alembic_version table. Nothing else is changed, so a wrong REVISION makes
    the next upgrade fail or skip steps: check with `memstore db check` afterwards.
    """
    url = _resolve(url)
    with _reporting(url):
        before, after = migrate.stamp(url, revision)
    click.echo(f"{_moved(url, before, after)} (stamped: no migration ran)")


@db.command()
def heads() -> None:
    """Show the head revision shipped with this memstore (what `db upgrade` migrates to)."""
    with _reporting(None):
        scripts = migrate.heads()
    for script in scripts:
        click.echo(f"{script.revision} (head): {(script.doc or '').strip()}")


@db.command()
@url_option
def check(url: str | None) -> None:
    """Check that the database is at head and its schema matches memstore's models.

    Exits 1 when it is behind head (or ahead: a newer memstore migrated it), or when a table,
    column or index differs from what the migrations create (changed by hand), listing each
    difference on stderr. Tables memstore does not model are another application's and ignored.
    Reads the catalog only.
    """
    url = _resolve(url)
    with _reporting(url):
        found = migrate.check(url)
    if not found.at_head:
        raise migrate.schema_not_ready(mask_url(url), found.current, found.head)
    if found.differences:
        echo_listing(f"{mask_url(url)} differs from memstore's models at {found.head}:", found.differences)
        raise MigrationError(
            f"database {mask_url(url)} is at head {found.head}, but its schema differs from memstore's "
            f"models in {len(found.differences)} place(s), listed above: changed outside the migrations"
        )
    click.echo(f"{mask_url(url)}: at head {found.head}; the schema matches memstore's models")


@db.command()
def history() -> None:
    """List the revisions shipped with this memstore, newest first."""
    with _reporting(None):
        scripts = migrate.history()
    for script in scripts:
        down = script.down_revision if isinstance(script.down_revision, str) else None
        mark = " (head)" if script.is_head else ""
        click.echo(f"{_label(down)} -> {script.revision}{mark}: {(script.doc or '').strip()}")


@db.command()
@click.option("--dialect", type=click.Choice(migrate.DIALECTS), help="Default: the configured database's.")
@click.option("--from", "from_rev", metavar="REV", help="Start revision (default: an empty database).")
@click.option("--to", "to_rev", metavar="REV", default="head", show_default=True, help="Target revision.")
def sql(dialect: migrate.Dialect | None, from_rev: str | None, to_rev: str) -> None:
    """Print the migration SQL for a DBA to review and apply, without connecting anywhere.

    A --to older than --from prints the downgrade.
    """
    with _reporting(None):
        chosen = dialect or migrate.dialect_of(_resolve(None))
        click.echo(migrate.render_sql(chosen, from_rev, to_rev), nl=False)


@db.command("grant-app-role")
@click.argument("role")
@click.option(
    "--create", is_flag=True, help="Create ROLE first (LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEROLE)."
)
@click.option(
    "--password-env",
    metavar="VAR",
    help="With --create: the environment variable holding ROLE's password (never given on the command line).",
)
@click.option("--print", "print_only", is_flag=True, help="Print the SQL for a DBA instead of running it.")
@url_option
def grant_app_role(
    role: str, create: bool, password_env: str | None, print_only: bool, url: str | None
) -> None:
    """Let ROLE run memstore's application under PostgreSQL's row-level security.

    Grants ROLE the rows of every memory table (SELECT, INSERT, UPDATE, DELETE), their id
    sequences and a read of alembic_version: nothing else, so it owns no table and every policy
    binds it. Runs on the operator connection (operator_database_url). Idempotent: run it again
    after a `db upgrade` that adds a table. --print shows the statements for the public schema.
    """
    url = _resolve(url)
    if migrate.dialect_of(url) != "postgresql":
        raise click.UsageError(
            f"grant-app-role needs PostgreSQL, and {mask_url(url)} is SQLite: SQLite has no roles or "
            "row-level security (memstore's own queries keep tenants apart there)"
        )
    if password_env is not None and not create:
        raise click.UsageError("--password-env sets the password of the role --create makes")
    password = None
    if password_env is not None and not print_only:
        password = os.environ.get(password_env)
        if not password:
            raise click.UsageError(f"--password-env {password_env}: that environment variable is not set")
    with _reporting(url):
        if print_only:
            statements = [roles.create_statement(role)] if create else []
            statements += roles.grant_statements(role)
        else:
            statements = roles.grant_app_role(get_engine(url), role, create=create, password=password)
    for statement in statements:
        click.echo(f"{statement};")
    if print_only and password_env is not None:
        click.echo(f"-- then set its password without it reaching the server's log: \\password {role}")
    if not print_only:
        click.echo(f"{mask_url(url)}: role {role} may use memstore's tables under row-level security")


def _resolve(url: str | None) -> str:
    """``--url``, else the configured operator's database (``operator_database_url``, else
    ``database_url``): migrations and grants need the tables' owner. A provider without one is
    an error."""
    if url:
        return url
    config = get_memory_config()
    if not issubclass(load_storage_class(config.storage_class), SqlMemoryStorage):
        raise click.ClickException(
            f"the configured storage_class {config.storage_class} keeps no database "
            "(pass --url to work on one)"
        )
    return operator_url_from_config(config)


@contextmanager
def _reporting(url: str | None) -> Iterator[None]:
    """Alembic's and the driver's failures as one clean, password-free line and exit status 1.

    memstore's own errors go on to the command group's one mapping (``memstore.cli``).
    """
    try:
        yield
    except CommandError as exc:
        raise click.ClickException(_scrub(str(exc), url)) from exc
    except DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        where = mask_url(url) if url else "the database"
        raise click.ClickException(_scrub(f"cannot use {where}: {reason}", url)) from exc
    except SQLAlchemyError as exc:
        raise click.ClickException(_scrub(str(exc).splitlines()[0], url)) from exc


def _scrub(message: str, url: str | None) -> str:
    """Drivers may echo connection details; never let the password through (as typed or URL-encoded).

    Passwords shorter than four characters are left alone: masking every "b" garbles the message.
    """
    try:
        password = make_url(url).password if url else None
    except Exception:
        password = None
    for secret in {str(password), quote(str(password), safe="")} if password else ():
        if len(secret) >= 4:
            message = message.replace(secret, "***")
    return message


def _moved(url: str, before: str | None, after: str | None) -> str:
    if before == after:
        return f"{mask_url(url)}: already at {_label(after)}"
    return f"{mask_url(url)}: {_label(before)} -> {_label(after)}"


def _dropped(drop: Dropped) -> str:
    if drop.rows is None:
        return f"{drop.kind} {drop.name}"
    return f"{drop.kind} {drop.name}: {drop.rows} row{'' if drop.rows == 1 else 's'}"


def _label(revision: str | None) -> str:
    return revision or "<base>"
