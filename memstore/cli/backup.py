"""``memstore backup`` and ``restore``: a whole SQL database, losslessly, into another one of either dialect.

Separate from ``export``/``import`` on purpose: those move DeerFlow documents per scope and
re-save them (new revisions, new ``lastUpdated``, no signals, vectors or history), which is right
for moving memory between systems and wrong for getting a database back.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import click

from memstore.cli.confirm import confirm_deletion, echo_listing, yes_option
from memstore.cli.output import echo_counts, echo_json, progress
from memstore.errors import BackupError
from memstore.ops.backup import (
    Progress,
    Start,
    backup_database,
    database_url,
    held_rows,
    not_empty_message,
    read_header,
    restore_database,
)
from memstore.storage.sql.engine import mask_url

url_option = click.option(
    "--url",
    metavar="URL",
    help="SQLAlchemy database URL. Default: the configured database_url, else the embedded SQLite file.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


@click.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@url_option
@json_option
def backup(file: Path, url: str | None, as_json: bool) -> None:
    """Copy every memory row of the database into FILE (gzip-compressed JSON Lines).

    Lossless, for ``memstore restore`` on SQLite or PostgreSQL: scopes with their revisions and
    lastUpdated, facts with tombstones and retention signals, summaries, embeddings with their
    model, the audit history and erasure records, ids included. It reads one consistent snapshot,
    so gateways may keep running; conversations still in the update queue are work in flight, not
    memory, and are not included. FILE appears only when complete, readable by its owner alone.
    """
    url = database_url(url)
    with ExitStack() as bars:
        report = backup_database(url, file, on_start=_bar(bars, "Backing up"))
    header = report.header
    if report.queued:
        click.echo(
            f"note: {report.queued} conversation(s) in the update queue are not in the backup; for a "
            "backup that misses no turn, stop the gateways and let the workers finish first",
            err=True,
        )
    if as_json:
        echo_json(
            {
                "file": str(file),
                "database": mask_url(url),
                "schema_revision": header.schema_revision,
                "rows": header.rows,
                "queued_not_included": report.queued,
            }
        )
    else:
        echo_counts(f"backed up {mask_url(url)} (schema {header.schema_revision}) to {file}:", header.rows)


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@url_option
@click.option(
    "--replace",
    is_flag=True,
    help="Delete the memory the database holds first (lists it and asks; --yes without a terminal).",
)
@yes_option
@json_option
def restore(file: Path, url: str | None, replace: bool, yes: bool, as_json: bool) -> None:
    """Load a backup made by ``memstore backup`` into the database, exactly as it was.

    The database must hold no memory (its schema is created on SQLite, and must be at head on
    PostgreSQL: ``memstore db upgrade``); --replace deletes what it holds instead, in the same
    transaction as the restore. All or nothing: a truncated or damaged file leaves the database
    as it was. Stop gateways and workers that use it first.
    """
    url = database_url(url)
    read_header(file)  # a file that is not a restorable backup fails before the database is touched
    held = held_rows(url)
    if any(held.values()):
        if not replace:
            raise BackupError(not_empty_message(url, held))
        where = mask_url(url)
        echo_listing(f"restore deletes what {where} holds:", (f"{t}: {n}" for t, n in held.items() if n))
        confirm_deletion(
            "restore over a database that holds memory", f"Delete it and restore {file}?", yes=yes
        )
    with ExitStack() as bars:
        report = restore_database(url, file, replace=replace, on_start=_bar(bars, "Restoring"))
    header = report.header
    if as_json:
        echo_json(
            {
                "file": str(file),
                "database": mask_url(url),
                "schema_revision": header.schema_revision,
                "source_dialect": header.source_dialect,
                "created_at": header.created_at,
                "rows": header.rows,
                "replaced": report.replaced,
            }
        )
    else:
        made = f"a {header.source_dialect} backup of {header.created_at}, schema {header.schema_revision}"
        echo_counts(f"restored {file} ({made}) into {mask_url(url)}:", header.rows)


def _bar(bars: ExitStack, label: str) -> Start:
    """A progress bar that appears once the total is known, closed with ``bars``."""

    def start(total: int) -> Progress:
        return bars.enter_context(progress(label, total))

    return start
