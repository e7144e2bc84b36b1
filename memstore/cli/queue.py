"""``memstore worker`` and ``memstore queue``: run the durable queue, and look after it."""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from typing import Any

import click

from memstore.cli.confirm import confirm_deletion, echo_listing, yes_option
from memstore.cli.exit_codes import EXIT_NOTHING_MATCHED
from memstore.cli.output import echo_json, echo_table
from memstore.cli.params import not_blank
from memstore.cli.worker_metrics import serve_metrics
from memstore.config import MemoryConfig, get_memory_config
from memstore.errors import ConfigError
from memstore.ops.lifecycle import run_lifecycle
from memstore.ops.queue import purge_counts, purge_dead, queue_status, retry_dead
from memstore.ops.sessions import expire_sessions
from memstore.queue.database import DatabaseUpdateQueue
from memstore.storage.loader import get_memory_storage, load_storage_class
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import database_url_from_config
from memstore.storage.sql.schema import migrate
from memstore.update.updater import MemoryUpdater

logger = logging.getLogger(__name__)


@click.command()
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=64),
    default=None,
    help="Worker threads (default: queue_workers, or 4 when that is 0).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus /metrics on this port (off by default).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    callback=not_blank,
    help="Address for --metrics-port.",
)
def worker(workers: int | None, metrics_port: int | None, metrics_host: str) -> None:
    """Run queue workers without a gateway, until SIGTERM or Ctrl-C.

    Each worker claims one scope at a time from the database queue, runs its conversations
    through the updater and saves them. It needs the SQL provider and database_url (the
    gateways' database), and checks the schema and LLM settings before it starts. On SIGTERM
    it stops claiming and waits up to shutdown_timeout_seconds for running conversations; what
    it does not finish stays queued.
    Every lifecycle_interval_seconds it deletes expired sessions and, with expire_below set,
    runs `memstore lifecycle run`.
    --metrics-port serves this process's Prometheus series and the queue's gauges.
    """
    config = get_memory_config()
    url = _queue_database(config)
    count = workers or config.queue_workers or 4
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        # How a worker is meant to stop (a deploy, Ctrl-C): news, not a warning.
        logger.info("memstore worker: %s received, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    metrics = serve_metrics(metrics_host, metrics_port) if metrics_port is not None else None
    queue = DatabaseUpdateQueue(url, workers=count)
    click.echo(f"memstore worker: {count} worker(s) on {queue.url} as {queue.owner}", err=True)
    if metrics is not None:
        click.echo(f"memstore worker: metrics at http://{metrics_host}:{metrics_port}/metrics", err=True)
    next_lifecycle = time.monotonic()
    while not stop.wait(1.0):
        if time.monotonic() >= next_lifecycle:
            next_lifecycle = time.monotonic() + config.lifecycle_interval_seconds
            _expire(config)
    finished = queue.shutdown(config.shutdown_timeout_seconds)
    if metrics is not None:
        metrics.shutdown()
    click.echo(f"memstore worker: stopped ({queue.stats.updated} updated)", err=True)
    if not finished:
        raise SystemExit(1)


def _queue_database(config: MemoryConfig) -> str:
    """The database whose queue the worker runs, once the setup can work at all.

    Each refusal is one line at start. Without these checks a worker claimed rows it could only
    fail (file provider, no model_name), or created an empty SQLite file and idled on it.
    """
    if config.queue_backend == "memory":
        raise ConfigError("queue_backend is 'memory': there is no database queue for a worker to run")
    if not issubclass(load_storage_class(config.storage_class), SqlMemoryStorage):
        raise ConfigError(
            "the durable queue lives in the SQL provider's database; "
            f"storage_class is {config.storage_class}: there is no queue for a worker to run"
        )
    if not config.database_url:
        raise ConfigError(
            "database_url is not set: a worker runs the queue of the gateways' database; set "
            f"MEMSTORE_DATABASE_URL (the embedded file here would be {database_url_from_config(config)})"
        )
    migrate.require_database(config.database_url)
    MemoryUpdater().prepare()  # the LLM settings, as each worker thread checks them before a claim
    get_memory_storage()  # the schema: at head, or (SQLite, auto_migrate) migrated now
    return database_url_from_config(config)


def _expire(config: MemoryConfig) -> None:
    """One scheduled lifecycle run (expired sessions only while ``expire_below`` is off); a failure
    is logged and retried at the next interval."""
    try:
        if config.expire_below is None:
            sessions = expire_sessions()
            removed = 0
        else:
            report = run_lifecycle(dry_run=False)
            sessions, removed = report.sessions_expired, report.removed
    except ConfigError as exc:  # e.g. row-level security without operator_database_url
        logger.warning("memstore worker: the scheduled lifecycle run cannot run: %s", exc)
        return
    except Exception:
        logger.exception("memstore worker: the scheduled lifecycle run failed; retrying next interval")
        return
    if removed:
        logger.warning("memstore worker: lifecycle run expired %d fact(s)", removed)
    if sessions:
        logger.info("memstore worker: %d expired session(s) deleted", sessions)


@click.group()
def queue() -> None:
    """The durable update queue: status, and dead conversations."""


@queue.command()
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def status(as_json: bool) -> None:
    """Pending, due, leased and dead conversations, the lag, and throughput."""
    figures = queue_status()
    if as_json:
        echo_json(
            {
                **{k: v for k, v in dataclasses.asdict(figures).items() if k != "dead_rows"},
                "dead_rows": [
                    {**dataclasses.asdict(row), "updated_at": row.updated_at.isoformat()}
                    for row in figures.dead_rows
                ],
            }
        )
        return
    lag = "none" if figures.oldest_pending_seconds is None else f"{figures.oldest_pending_seconds:.1f} s"
    click.echo(
        f"pending: {figures.pending} (due now: {figures.due})  leased: {figures.leased}  dead: {figures.dead}"
    )
    window = figures.throughput_window_seconds
    span = f"{window / 60:.0f} min" if window >= 120 else f"{window:.0f} s"
    click.echo(
        f"oldest waiting turn: {lag}  throughput: {figures.throughput_per_minute:.1f}/min (last {span})"
    )
    config = get_memory_config()
    click.echo(
        f"bounds: {figures.pending + figures.leased + figures.dead:,} of {config.max_queue_depth:,} "
        "conversations, "
        f"{figures.held_chars:,} of {config.max_queue_chars:,} characters; "
        f"users at their share ({config.queue_user_share:g}): {figures.users_at_share}"
    )
    if figures.dead_rows:
        echo_table(
            ("ID", "USER", "AGENT", "THREAD", "ATTEMPTS", "LAST ERROR"),
            [
                (row.id, row.user_id, row.agent_name, row.thread_id, row.attempts, row.last_error)
                for row in figures.dead_rows
            ],
        )


def _ids(ids: tuple[int, ...], all_dead: bool) -> list[int] | None:
    if bool(ids) == all_dead:
        raise click.UsageError("give dead row ids, or --all")
    return None if all_dead else list(ids)


@queue.command()
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "all_dead", is_flag=True, help="Every dead conversation.")
def retry(ids: tuple[int, ...], all_dead: bool) -> None:
    """Queue dead conversations again, due now (after fixing what killed them)."""
    count = retry_dead(_ids(ids, all_dead))
    click.echo(f"{count} dead conversation(s) queued again")
    if not count:
        raise SystemExit(EXIT_NOTHING_MATCHED)


@queue.command()
@click.argument("ids", nargs=-1, type=int)
@click.option("--all", "all_dead", is_flag=True, help="Every dead conversation.")
@yes_option
def purge(ids: tuple[int, ...], all_dead: bool, yes: bool) -> None:
    """Delete dead conversations for good.

    First lists them per state and user (on stderr), then asks.
    """
    selected = _ids(ids, all_dead)
    doomed = purge_counts(selected)
    if doomed:
        echo_listing(
            f"queue purge deletes {sum(rows for *_, rows in doomed)} conversation(s):",
            (f"{state}, user {user_id or '(none)'}: {rows}" for state, user_id, rows in doomed),
        )
        confirm_deletion("purge", "Delete them? They will not be processed", yes=yes)
    count = purge_dead(selected)
    click.echo(f"{count} dead conversation(s) deleted")
    if not count:
        raise SystemExit(EXIT_NOTHING_MATCHED)
