"""``memstore lifecycle run``: expire facts whose decay score fell under ``expire_below``."""

from __future__ import annotations

import click

from memstore.cli.exit_codes import EXIT_NOTHING_MATCHED
from memstore.cli.output import echo_json, echo_table, user_id_option
from memstore.ops.lifecycle import LifecycleReport, run_lifecycle


@click.group()
def lifecycle() -> None:
    """Memory lifecycle: expiry by decay score (see docs/operations.md)."""


@lifecycle.command("run")
@click.option("--dry-run", is_flag=True, help="List what would be removed, with scores; change nothing.")
@click.option("--user", "user_id", callback=user_id_option, help="Only this user's facts.")
@click.option(
    "--below",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    help="Threshold for this run (default: the expire_below setting).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def run(dry_run: bool, user_id: str | None, below: float | None, as_json: bool) -> None:
    """Remove every fact whose decay score is under the threshold, audited with origin lifecycle.

    Decay is confidence x max(freshness since the last confirmation, access heat); categories in
    staleness_protected_categories never expire. Exits 4 when nothing is under the threshold.
    """
    report = run_lifecycle(dry_run=dry_run, user_id=user_id, threshold=below)
    if as_json:
        echo_json(report.to_json())
    else:
        _print(report)
    if not report.expiring:
        raise SystemExit(EXIT_NOTHING_MATCHED)


def _print(report: LifecycleReport) -> None:
    rows = [
        (
            fact.user_id or "-",
            fact.agent_name or "-",
            fact.fact_id,
            fact.category,
            f"{fact.decay.value:.3f}",
            f"{fact.decay.confidence:.2f}",
            f"{fact.decay.freshness:.3f}",
            f"{fact.decay.heat:.3f}",
            fact.content,
        )
        for fact in report.expiring
    ]
    if rows:
        echo_table(("USER", "AGENT", "ID", "CATEGORY", "DECAY", "CONF", "FRESHNESS", "HEAT", "CONTENT"), rows)
    verb = "would remove" if report.dry_run else "removed"
    count = len(report.expiring) if report.dry_run else report.removed
    click.echo(
        f"{verb} {count} fact(s) with decay below {report.threshold} "
        f"({report.scopes_scanned} scope(s) scanned at {report.evaluated_at.isoformat()})"
    )
