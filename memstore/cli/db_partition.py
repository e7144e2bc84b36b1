"""``memstore db partition``: the optional partitioned layout for large PostgreSQL databases.

Registered on the ``db`` group (``memstore.cli``); see ``storage/sql/maintenance/partition.py`` for
what it changes and docs/scale.md "Partitioned tables" for when to use it.
"""

from __future__ import annotations

import click

from memstore.cli.db import _reporting, _resolve, url_option
from memstore.storage.sql.engine import get_engine, mask_url
from memstore.storage.sql.maintenance import history_months, partition


@click.command("partition")
@click.option(
    "--partitions",
    type=click.IntRange(2, partition.MAX_PARTITIONS),
    default=partition.DEFAULT_PARTITIONS,
    show_default=True,
    help="Hash partitions of each per-user table (facts, embeddings, sessions, session turns).",
)
@click.option(
    "--months-ahead",
    type=click.IntRange(0, history_months.MAX_MONTHS_AHEAD),
    default=history_months.MONTHS_AHEAD,
    show_default=True,
    help="History's month partitions created after the current month (vacuum keeps them ahead).",
)
@click.option("--sql", "print_only", is_flag=True, help="Print the SQL for a DBA instead of running it.")
@url_option
def partition_command(partitions: int, months_ahead: int, print_only: bool, url: str | None) -> None:
    """Move a PostgreSQL database at head to the partitioned layout, in one transaction.

    Hash-partitions memory_facts and memory_fact_embeddings by scope, memory_sessions and
    memory_session_turns by user, and range-partitions memory_history by month (with a DEFAULT
    partition), keeping every index, constraint, grant and row-level security policy. Copies every
    row, holding the tables until it commits. Refuses SQLite, a database behind head and one
    already partitioned. --sql prints what it would run (BEGIN ... COMMIT, for psql -f).
    """
    url = _resolve(url)
    engine = get_engine(url)
    with _reporting(url):
        if print_only:
            if engine.dialect.name != "postgresql":
                partition.partition(engine)  # refuses SQLite with the one message
            with engine.connect() as conn:
                script = partition.render(conn, partitions=partitions, months_ahead=months_ahead)
            click.echo(script, nl=False)
            return
        run = partition.partition(engine, partitions=partitions, months_ahead=months_ahead)
    click.echo(
        f"{mask_url(url)}: partitioned {', '.join(partition.TABLES)} "
        f"({partitions} hash partitions; history by month) in {len(run)} statements"
    )
