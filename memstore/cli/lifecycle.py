"""``memstore lifecycle run``: expire facts whose decay score fell under ``expire_below``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click

from memstore.cli.exit_codes import EXIT_NOTHING_MATCHED
from memstore.cli.output import echo_json_report, echo_table, user_id_option
from memstore.cli.params import FiniteFloatRange, tenant_id_option
from memstore.ops.lifecycle import LifecycleReport, Progress, run_lifecycle


@click.group()
def lifecycle() -> None:
    """Memory lifecycle: expiry by decay score (see docs/operations.md)."""


@lifecycle.command("run")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Report what each rule would do with the current settings; change nothing.",
)
@click.option("--user", "user_id", callback=user_id_option, help="Only this user's facts.")
@click.option("--tenant", "tenant_id", callback=tenant_id_option, help="Only this tenant's facts.")
@click.option(
    "--below",
    type=FiniteFloatRange(0, 1, min_open=True, max_open=True),
    help="Threshold for this run (default: the expire_below setting).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    help="List the N expiring facts with the lowest decay (default: the summary only; --json lists all).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def run(
    dry_run: bool,
    user_id: str | None,
    tenant_id: str | None,
    below: float | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """Remove every fact whose decay score is under the threshold, audited with origin lifecycle.

    Decay is confidence x max(freshness since the last confirmation, access heat); categories in
    staleness_protected_categories never expire. Prints a summary per rule (--limit N lists
    facts), with a progress bar on a terminal. Nothing to expire is a result (exit 0); a --user
    with nothing stored exits 4.
    """
    # Without --tenant the run is the operator's, over every tenant the store serves.
    with _progress_bar("Scoring facts" if dry_run else "Expiring facts", shown=not as_json) as progress:
        report = run_lifecycle(
            dry_run=dry_run, user_id=user_id, threshold=below, tenant_id=tenant_id, progress=progress
        )
    if user_id is not None and not report.scopes_scanned:
        click.echo(f"nothing is stored for {user_id}", err=True)
        raise SystemExit(EXIT_NOTHING_MATCHED)
    if as_json:
        echo_json_report(report.to_json(limit))
    else:
        _print(report, limit or 0)


@contextmanager
def _progress_bar(label: str, *, shown: bool) -> Iterator[Progress | None]:
    """A bar on stderr while the run scores (68 s over 100,000 facts once, with nothing shown):
    only on a terminal, and never under --json, so what scripts and logs read stays the report."""
    stderr = sys.stderr
    if not shown or not stderr.isatty():
        yield None
        return
    from rich import progress as rich_progress
    from rich.console import Console  # imported on use, like every Rich piece of the CLI

    console = Console(file=stderr, no_color=bool(os.environ.get("NO_COLOR")), highlight=False)
    columns = (
        rich_progress.TextColumn(label),
        rich_progress.BarColumn(),
        rich_progress.MofNCompleteColumn(),
        rich_progress.TimeElapsedColumn(),
    )
    # stdout stays the report's alone: Rich would route writes to it through the bar's stream.
    with rich_progress.Progress(*columns, console=console, transient=True, redirect_stdout=False) as bar:
        task = bar.add_task(label, total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield advance


def _print(report: LifecycleReport, limit: int) -> None:
    kind = "dry run" if report.dry_run else "run"
    at = report.evaluated_at.isoformat(timespec="seconds")
    click.echo(
        f"lifecycle {kind} at {at}: {report.scopes_scanned} scope(s), {report.live_facts} live fact(s)"
    )
    if report.threshold is None:
        click.echo("expiry:     off: expire_below is not set (--below X shows what a threshold would remove)")
    else:
        verb = "would remove" if report.dry_run else "removed"
        count = len(report.expiring) if report.dry_run else report.removed
        click.echo(
            f"expiry:     {verb} {count} fact(s) with decay below {report.threshold} "
            f"(in {report.expiring_scopes} scope(s))"
        )
    categories = ", ".join(report.protected_categories) or "none"
    click.echo(f"protected:  {report.protected} fact(s) never expire (categories: {categories})")
    if report.over_cap:
        click.echo(
            f"cap:        {report.over_cap} fact(s) over max_facts {report.max_facts} in "
            f"{report.scopes_over_cap} scope(s): the next save that adds facts there evicts them"
        )
    else:
        click.echo(f"cap:        no scope is over max_facts {report.max_facts}")
    if not report.dry_run:
        click.echo(f"sessions:   {report.sessions_expired} expired session(s) deleted")
    shown = report.lowest(limit)
    if shown:
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
            for fact in shown
        ]
        echo_table(("USER", "AGENT", "ID", "CATEGORY", "DECAY", "CONF", "FRESHNESS", "HEAT", "CONTENT"), rows)
    if not shown and report.expiring:
        click.echo("--limit N lists them, lowest decay first")
    elif len(shown) < len(report.expiring):
        click.echo(f"listed the {len(shown)} lowest of {len(report.expiring)}; --limit N lists more")
