#!/usr/bin/env python3
"""memstore's benchmark: every scenario's variants measured side by side in one run.

Absolute times drift on shared machines, so each verdict is a ratio between variants of the same
run (or, for injection, an absolute median). Writes a table to stdout, ``results.json`` and
``chart.png`` to ``--out`` (by default ``.bench/``, ignored by git; ``bench/``, the published
copy, with ``--write-docs``), and with ``--write-docs`` the generated regions of docs/performance.md
(the queue scenario and the large-scope one have their own, so ``--only queue`` or ``--only large``
can refresh one alone). ``--only access`` runs the access-tracking scenario alone (request path with
tracking on vs off) into ``results.json``; ``--only sessions`` the session-memory scenarios
(``bench_sessions.py``: append, context and compression on SQLite, PostgreSQL and Redis);
``--only async`` the async face (``bench_async.py``: a burst of ``memory_context`` calls on one
event loop, async face vs thread pool, and the LangGraph store against LangGraph's async stores);
``--only scale`` plain vs partitioned tables at 10,000,000 facts on PostgreSQL (``bench_scale.py``;
1,000,000 with ``--quick``), never part of a full run: it takes the better part of an hour.
``--only lean`` measures issue 37's figures for a baseline revision (``--baseline REV``, exported
with ``git archive``) and the checkout side by side (``bench_lean.py``), never part of a full run
either: it compares code versions, not variants of one.

    .venv/bin/python scripts/bench.py [--quick | --smoke]
        [--only queue|access|tenancy|large|sessions|async|scale|lean] [--baseline REV]
        [--out DIR] [--write-docs]

PostgreSQL scenarios run when MEMSTORE_BENCH_PG_URL names a server; the benchmark creates and
drops its own database there. The Redis session scenario runs on MEMSTORE_BENCH_REDIS_URL (``off``
skips it), else on redis://127.0.0.1:6379/0 if it answers.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bench_async
import bench_concurrency
import bench_large
import bench_large_report
import bench_lean
import bench_lean_report
import bench_pg
import bench_queue
import bench_relevance
import bench_report
import bench_scale
import bench_scenarios
import bench_search
import bench_sessions
import bench_tenancy
import sqlalchemy
from bench_core import SQLITE_NORMAL, Result
from bench_data import use_bench_config

from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, mask_url

ROOT = Path(__file__).resolve().parents[1]
FULL_SCALE_SCOPES = 100_000
SCALE_FACTS = 20


@dataclass(frozen=True)
class Mode:
    loads: int
    saves: int
    injections: int
    scale_scopes: int
    scale_loads: int
    concurrent_saves: int
    concurrent_rounds: int
    warmup: int
    searches: int
    search_users: int
    large: int
    """Iterations of each large-scope scenario (every size in each)."""


MODES = {
    "full": Mode(2000, 150, 2000, FULL_SCALE_SCOPES, 2000, 300, 4, 50, 30, bench_search.FULL_USERS, 40),
    "quick": Mode(400, 40, 500, 10_000, 400, 80, 2, 20, 10, 5_000, 10),
    "smoke": Mode(5, 3, 5, 300, 5, 4, 1, 1, 2, 200, 1),
}


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer iterations and 10,000 scopes (< 3 minutes)")
    size.add_argument("--smoke", action="store_true", help="a handful of iterations: checks the harness only")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where results.json and chart.png go (default: bench/ with --write-docs, else .bench/, "
        "which git ignores, so a plain run leaves the checkout clean)",
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="scratch space (default: system temp)")
    parser.add_argument(
        "--write-docs", action="store_true", help="refresh the generated regions of docs/performance.md"
    )
    parser.add_argument(
        "--only",
        choices=["queue", "access", "tenancy", "large", "sessions", "async", "scale", "lean"],
        help="run one scenario; results.json keeps the others' entries, the chart is left alone "
        "(an access-only run never writes docs)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="--only lean: the revision measured beside the checkout "
        f"(default {bench_lean.DEFAULT_BASELINE}; --smoke: the checkout itself)",
    )
    args = parser.parse_args(argv)
    if args.baseline is not None and args.only != "lean":
        parser.error("--baseline goes with --only lean")
    return args


def _meta(
    mode_name: str, mode: Mode, pg_server: str | None, pg_version: str | None, core: bool
) -> dict[str, Any]:
    notes = []
    if core and mode.scale_scopes != FULL_SCALE_SCOPES:
        notes.append(
            f"{mode_name} mode: the scale scenario used {mode.scale_scopes:,} scopes, "
            f"not {FULL_SCALE_SCOPES:,}, and semantic search {mode.scale_scopes:,} vectors, "
            f"not {FULL_SCALE_SCOPES:,}; search at scale {mode.search_users * bench_search.FACTS_PER_USER:,} "
            f"facts of {mode.search_users:,} users, not "
            f"{bench_search.FULL_USERS * bench_search.FACTS_PER_USER:,} of {bench_search.FULL_USERS:,}"
        )
    if pg_server is None:
        notes.append(f"PostgreSQL scenarios skipped: {bench_pg.PG_URL_ENV} is not set")
    return {
        "mode": mode_name,
        "iterations": asdict(mode),
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "postgresql_server": mask_url(pg_server) if pg_server else None,
        "postgresql_version": pg_version,
        "notes": notes,
    }


def _stage(name: str, start: float) -> None:
    print(f"  {name} done at {time.perf_counter() - start:.1f} s", flush=True)


def _core(stores: bench_scenarios.Stores, mode: Mode, work: Path, pg_url: str | None) -> list[Result]:
    start = time.perf_counter()
    results = bench_scenarios.load_warm(stores, mode.loads, mode.warmup)
    results += bench_scenarios.access_tracking(work, pg_url, stores.pg_durability, mode.loads, mode.warmup)
    results += bench_scenarios.load_cold(stores, mode.loads, mode.warmup)
    _stage("loads", start)
    results += bench_scenarios.save_add_one(stores, mode.saves, min(mode.warmup, 3))
    _stage("saves", start)
    results += bench_scenarios.inject(mode.injections, mode.warmup)
    results += bench_relevance.inject_query(work, mode.injections, mode.warmup)
    _stage("injection", start)
    results += bench_relevance.semantic_search(
        work, pg_url, mode.scale_scopes // 20, SCALE_FACTS, mode.searches, min(mode.warmup, 3)
    )
    _stage("semantic search", start)
    results += bench_scenarios.scale(work, mode.scale_scopes, SCALE_FACTS, mode.scale_loads, mode.warmup)
    _stage("scale", start)
    backends = {"sqlite": (f"sqlite:///{work / 'concurrency.db'}", SQLITE_NORMAL)}
    if pg_url is not None:
        backends["postgresql"] = (pg_url, stores.pg_durability)
    results += bench_concurrency.concurrent_saves(
        backends, work, mode.concurrent_saves, mode.concurrent_rounds
    )
    _stage("concurrency", start)
    return results


def _queue(mode_name: str, work: Path, pg_url: str | None, pg_durability: str) -> list[Result]:
    start = time.perf_counter()
    queue_url = f"sqlite:///{work / 'queue.db'}"
    SqlMemoryStorage(queue_url)  # migrated before the worker processes start
    backends = {"sqlite": (queue_url, SQLITE_NORMAL)}
    if pg_url is not None:
        backends["postgresql"] = (pg_url, pg_durability)
    results = bench_queue.queue_throughput(backends, mode_name)
    _stage("queue", start)
    return results


def _large(mode: Mode, work: Path, pg_server: str | None, pg_durability: str) -> list[Result]:
    """The large-scope scenario, on SQLite and (in a database of its own) PostgreSQL."""
    start = time.perf_counter()
    backends = [bench_large.Backend("sqlite", f"sqlite:///{work / 'large.db'}", SQLITE_NORMAL)]
    with ExitStack() as stack:
        if pg_server is not None:
            url = stack.enter_context(bench_pg.bench_database(pg_server))
            backends.append(bench_large.Backend("postgresql", url, pg_durability))
        results = bench_large.large_scope(backends, mode.large, min(mode.warmup, 3))
    _stage("large scope", start)
    return results


def run(
    mode_name: str, work: Path, pg_server: str | None, only: str | None = None, baseline: str | None = None
) -> tuple[list[Result], dict[str, Any]]:
    """Every scenario, or with ``only`` that scenario alone (``baseline``: the lean scenario's)."""
    mode = MODES[mode_name]
    use_bench_config(work)
    results: list[Result] = []
    notes: list[str] = []
    lean: dict[str, Any] = {}
    with ExitStack() as stack:
        # The lean scenario migrates databases of its own, one per tree, each with that tree's code.
        pg_url = (
            stack.enter_context(bench_pg.bench_database(pg_server)) if pg_server and only != "lean" else None
        )
        probed = pg_server if only == "lean" else pg_url
        pg_conn = bench_pg.connect(probed) if probed else None
        if pg_conn is not None:
            stack.callback(pg_conn.close)
        pg_version = str(pg_conn.execute("SHOW server_version").fetchone()[0]) if pg_conn else None
        pg_durability = bench_pg.durability(pg_conn) if pg_conn else ""
        if only is None:
            stores = bench_scenarios.open_stores(work, pg_url)
            stack.callback(stores.raw.close)
            stack.callback(stores.langgraph.conn.close)
            if stores.pg_conn is not None:
                stack.callback(stores.pg_conn.close)
            results += _core(stores, mode, work, pg_url)
            started = time.perf_counter()
            results += bench_search.search_at_scale(
                work, pg_server, pg_durability, mode.search_users, mode.searches * 4
            )
            _stage("search at scale", started)
        if pg_url is not None and only in (None, "tenancy"):
            started = time.perf_counter()
            results += bench_tenancy.tenancy(pg_url, pg_durability, mode.loads, mode.warmup)
            _stage("tenancy", started)
        if only in (None, "large"):
            results += _large(mode, work, pg_server, pg_durability)
        if only in (None, "sessions"):
            started = time.perf_counter()
            found, notes = bench_sessions.sessions(
                work, pg_url, pg_durability, mode.loads, mode.saves, mode.warmup
            )
            results += found
            _stage("sessions", started)
        if only in (None, "async"):
            started = time.perf_counter()
            found, more = bench_async.async_scenarios(work, pg_url, pg_durability, mode_name)
            results += found
            notes += more
            _stage("async", started)
        if only == "scale" and pg_server is not None:
            started = time.perf_counter()
            results += bench_scale.scale(pg_server, pg_durability, mode_name)
            _stage("scale", started)
        if only == "lean":
            started = time.perf_counter()
            found, lean = bench_lean.lean(mode_name, work, pg_server, pg_durability, baseline)
            results += found
            notes += lean["notes"]
            _stage("lean", started)
        if only == "access":
            results += bench_scenarios.access_tracking(work, pg_url, pg_durability, mode.loads, mode.warmup)
        elif only in (None, "queue"):
            results += _queue(mode_name, work, pg_url, pg_durability)
    dispose_engines()
    meta = _meta(mode_name, mode, pg_server, pg_version, only is None)
    meta["notes"] += notes
    if lean:
        meta["lean"] = lean  # main() moves it to results.json's own "lean" key
    return results, meta


def _is_access(scenario: str) -> bool:
    return scenario == bench_scenarios.ACCESS_SCENARIO


def _is_tenancy(scenario: str) -> bool:
    return scenario.startswith("tenancy_")


def _is_sessions(scenario: str) -> bool:
    return scenario.startswith(bench_sessions.SCENARIO_PREFIX)


def _is_async(scenario: str) -> bool:
    return scenario.startswith(bench_async.SCENARIO_PREFIX)


def _is_scale(scenario: str) -> bool:
    return scenario.startswith(bench_scale.SCENARIO_PREFIX)


def _is_queue(scenario: str) -> bool:
    return scenario.startswith(bench_queue.SCENARIO_PREFIX)


def _is_large(scenario: str) -> bool:
    return scenario.startswith(bench_large.SCENARIO_PREFIX)


def _is_lean(scenario: str) -> bool:
    return scenario.startswith(bench_lean.SCENARIO_PREFIX)


def _region(scenario: str) -> str:
    """Which generated region of docs/performance.md a scenario (or a ratio's subject) belongs to."""
    if _is_lean(scenario):
        return "lean"
    return "queue" if _is_queue(scenario) else "large" if _is_large(scenario) else "main"


def _blocks(
    meta: dict[str, Any],
    title: str,
    results: list[Result],
    rows: list[dict[str, Any]],
    lean: dict[str, Any],
) -> list[str]:
    """The generated text: the main region's, the queue region's, the large-scope region's, the
    lean region's (each empty if nothing ran; ``lean``: the lean run's trees and profiles)."""
    header = (
        f"_{title}; wall time {meta['wall_seconds']} s; load average {meta['load_average']} at the start; "
        f"Python {meta['python']}, SQLite {meta['sqlite']}, "
        f"PostgreSQL {meta['postgresql_version'] or 'not run'}._"
    )
    notes = "\n".join(f"- {note}" for note in meta["notes"])
    parts = []
    for region in ("main", "queue", "large", "lean"):
        ran = [r for r in results if _region(r.scenario) == region]
        ratios = [row for row in rows if _region(row["subject"]) == region]
        if region == "lean":
            parts.append((header, *bench_lean_report.lean_parts(ran, ratios, lean), notes) if ran else ())
            continue
        table = {"queue": bench_report.queue_table, "large": bench_large_report.large_table}.get(
            region, bench_report.results_table
        )
        tables: tuple[str, ...] = ()
        if region == "main":
            tables = (bench_sessions.sessions_table(ran), bench_async.async_table(ran))
        parts.append((header, bench_report.verdict_table(ratios), table(ran), *tables, notes) if ran else ())
    return ["\n\n".join(part for part in block if part) for block in parts]


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    mode_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    pg_server = os.environ.get(bench_pg.PG_URL_ENV) or None
    only = f", {args.only} scenario only" if args.only else ""
    print(f"memstore benchmark, {mode_name} mode{only}", flush=True)
    started = time.perf_counter()
    load_average = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="memstore-bench-", dir=args.work_dir) as work:
        results, meta = run(mode_name, Path(work), pg_server, args.only, args.baseline)
    lean = meta.pop("lean", {})
    meta["wall_seconds"] = round(time.perf_counter() - started, 1)
    meta["load_average"] = load_average
    rows = bench_report.verdicts(results)
    out: Path = args.out or (ROOT / "bench" if args.write_docs else ROOT / ".bench")
    out.mkdir(parents=True, exist_ok=True)
    title = f"memstore benchmark ({mode_name}, {meta['generated_at']}, {meta['cpus']} CPUs)"
    if args.only:
        replaces = {
            "queue": _is_queue,
            "access": _is_access,
            "tenancy": _is_tenancy,
            "large": _is_large,
            "sessions": _is_sessions,
            "async": _is_async,
            "scale": _is_scale,
            "lean": _is_lean,
        }[args.only]
        bench_report.merge_json(out / "results.json", meta, results, rows, replaces)
        if lean:
            bench_lean.write_summary(out / "results.json", lean, rows)
    else:
        bench_report.write_json(out / "results.json", meta, results, rows)
        bench_report.write_chart(out / "chart.png", results, title)
    blocks = _blocks(meta, title, results, rows, lean)
    print("\n" + "\n\n".join(block for block in blocks if block))
    print(f"\nwrote {out / 'results.json'}" + ("" if args.only else f" and {out / 'chart.png'}"))
    if args.only == "scale":
        print("\n" + bench_scale.scale_table(results))
    if args.write_docs and args.only in ("access", "tenancy", "sessions", "async", "scale"):
        print(f"not writing docs/performance.md: a {args.only}-only run would replace the main table")
    elif args.write_docs:
        regions = (
            bench_report.DOCS_MARKERS,
            bench_report.QUEUE_MARKERS,
            bench_report.LARGE_MARKERS,
            bench_lean_report.MARKERS,
        )
        for block, markers in zip(blocks, regions, strict=True):
            if block:
                bench_report.write_docs(ROOT / "docs" / "performance.md", block, markers)
        print("updated docs/performance.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
