"""``memstore erase`` and ``memstore vacuum``: the two commands that delete data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click

from memstore.cli.confirm import confirm_deletion, echo_listing, yes_option
from memstore.cli.exit_codes import EXIT_NOTHING_MATCHED
from memstore.cli.output import echo_counts, echo_json, user_id_option
from memstore.cli.params import TENANT_OPTION
from memstore.config import get_memory_config
from memstore.queries import erase_user, list_scopes, vacuum_counts
from memstore.queries import vacuum as vacuum_store
from memstore.storage.sessions.loader import session_backend

MAX_DAYS = 36_500
"""A century: older than that is everything, and far larger values overflow the date arithmetic."""


@click.command()
@click.option(
    "--user", "user_id", callback=user_id_option, required=True, help="The user whose memory is erased."
)
@TENANT_OPTION
@yes_option
@click.option("--json", "as_json", is_flag=True, help="Print the deleted row counts as JSON.")
def erase(user_id: str, tenant_id: str | None, yes: bool, as_json: bool) -> None:
    """Delete every row of a user: all scopes, facts, summaries and audit history.

    Updates for the user still queued in running gateways are refused when they arrive (SQL
    provider), so the memory does not come back. Exits with 4 when nothing was stored for the
    user (usually a mistyped id); the erasure is recorded all the same, for updates still queued.
    """
    confirm_deletion("erase", f"Erase all memory of user {user_id!r}? This cannot be undone", yes=yes)
    scopes = bool(list_scopes(user_id, tenant_id=tenant_id))
    counts = erase_user(user_id, tenant_id=tenant_id)
    if session_backend(get_memory_config()) == "memory":
        click.echo(
            "note: session_backend is 'memory': the user's sessions live in each gateway process and "
            "were not erased from here (call memstore.queries.erase_user in those processes)",
            err=True,
        )
    if not (scopes or counts.get("memory_sessions") or counts.get("sessions")):
        # A typo in a person's erasure request must not pass as done. The erasure is still
        # recorded: the user's first conversations may be queued and must not land after it.
        click.echo(
            f"nothing was stored for user {user_id!r} (check the id); updates still queued for it "
            "will be refused",
            err=True,
        )
        raise SystemExit(EXIT_NOTHING_MATCHED)
    if as_json:
        echo_json({"user": user_id, "deleted": counts})
    else:
        echo_counts(f"erased user {user_id}; rows deleted:", counts)


@click.command()
@click.option(
    "--older-than",
    "days",
    required=True,
    type=click.IntRange(0, MAX_DAYS),
    help="Purge audit history and tombstones older than this many days.",
)
@yes_option
@click.option("--json", "as_json", is_flag=True, help="Print the purged row counts as JSON.")
def vacuum(days: int, yes: bool, as_json: bool) -> None:
    """Purge old audit history, tombstones of deleted facts and erasure records.

    Live memory is never touched. A writer holding a document older than the purge can no
    longer merge it; its save is refused and logged instead of resurrecting purged facts.
    When it would purge any row it lists them per table (on stderr) and asks first.
    """
    now, older_than = datetime.now(UTC), timedelta(days=days)
    pending = vacuum_counts(older_than, now=now)  # None: a provider that cannot count ahead
    if pending is None or any(pending.values()):
        if pending:
            echo_listing(
                f"vacuum purges rows older than {days} day(s):", (f"{t}: {n}" for t, n in pending.items())
            )
        question = f"Purge what is older than {days} day(s)? This cannot be undone"
        confirm_deletion("vacuum", question, yes=yes)
    counts = vacuum_store(older_than, now=now)
    if as_json:
        echo_json({"older_than_days": days, "purged": counts})
    elif counts:
        echo_counts(f"purged rows older than {days} day(s):", counts)
    else:
        click.echo("nothing to vacuum: this storage keeps no history or tombstones")
