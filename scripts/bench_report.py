"""Targets and verdicts, and the three outputs: a text table, ``results.json`` and a PNG chart."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import bench_async
import bench_large_report
import bench_lean_report
import bench_sessions
import matplotlib.pyplot as plt  # the backend is chosen above, before pyplot loads
from bench_core import Result

DOCS_MARKERS = ("<!-- bench:begin -->", "<!-- bench:end -->")
SEARCH_SCENARIO = "search_at_scale"
QUEUE_MARKERS = ("<!-- bench-queue:begin -->", "<!-- bench-queue:end -->")
LARGE_MARKERS = ("<!-- bench-large:begin -->", "<!-- bench-large:end -->")


@dataclass(frozen=True)
class Target:
    """``scenario/variant`` against ``ref`` (another variant's median, or milliseconds when ``ref`` is None).

    ``limit`` None marks an informational ratio (reported, no verdict). Throughput targets are
    "at least", latency targets "at most". ``metric`` compares that ``extra`` value instead of
    the median (at most, like a latency).
    """

    key: str
    text: str
    subject: tuple[str, str]
    ref: tuple[str, str] | None
    limit: float | None
    throughput: bool = False
    metric: str | None = None


TARGETS: tuple[Target, ...] = (
    Target(
        "warm_load",
        "warm load ≤ 2× file warm load",
        ("load_warm_100", "sqlite"),
        ("load_warm_100", "file"),
        2,
    ),
    Target(
        "cold_vs_floor",
        "cold load ≤ 3× raw sqlite3 floor",
        ("load_cold_100", "sqlite"),
        ("load_cold_100", "sqlite3_floor"),
        3,
    ),
    Target(
        "cold_vs_langgraph",
        "cold load ≤ 1× LangGraph SqliteStore get",
        ("load_cold_100", "sqlite"),
        ("load_cold_100", "langgraph_sqlite"),
        1,
    ),
    Target(
        "save_scaling",
        "save at 500 facts ≤ 1.5× save at 10",
        ("save_add1_500", "sqlite"),
        ("save_add1_10", "sqlite"),
        1.5,
    ),
    Target(
        "save_vs_langgraph_10",
        "save +1 fact at 10 facts ≤ 2× LangGraph SqliteStore put",
        ("save_add1_10", "sqlite"),
        ("save_add1_10", "langgraph_sqlite"),
        2,
    ),
    Target(
        "save_vs_langgraph_500",
        "save +1 fact at 500 facts ≤ 2× LangGraph SqliteStore put",
        ("save_add1_500", "sqlite"),
        ("save_add1_500", "langgraph_sqlite"),
        2,
    ),
    Target(
        "save_vs_file",
        "save at 500 ≤ 0.5× file at 500 (shipped durability: no fsync vs fsync)",
        ("save_add1_500", "sqlite"),
        ("save_add1_500", "file"),
        0.5,
    ),
    Target(
        "save_vs_file_same_durability",
        "save at 500, both fsync per save (like for like)",
        ("save_add1_500", "sqlite_sync_full"),
        ("save_add1_500", "file"),
        None,
    ),
    Target("inject", "injection of 500 facts: median ≤ 1 ms", ("inject_500", "tiktoken"), None, 1),
    Target(
        "inject_query",
        "query-aware injection of 500 facts (load, rank, render; embedding excluded): median ≤ 5 ms",
        ("inject_query_500", "query_aware"),
        None,
        5,
    ),
    Target(
        "inject_query_vs_confidence",
        "query-aware vs confidence-ordered injection of 500 facts (same load and render)",
        ("inject_query_500", "query_aware"),
        ("inject_query_500", "confidence_order"),
        None,
    ),
    Target(
        "semantic_search_vec",
        "semantic search over every scope: sqlite-vec vs the exact numpy scan",
        ("semantic_search_100k", "sqlite_vec"),
        ("semantic_search_100k", "sqlite_exact"),
        None,
    ),
    Target(
        "access_tracking",
        "warm load + injection of 100 facts, access tracking on ≤ 1.2× off",
        ("load_inject_100_access", "sqlite_tracking_on"),
        ("load_inject_100_access", "sqlite_tracking_off"),
        1.2,
    ),
    Target(
        "pg_access_tracking",
        "PostgreSQL: warm load + injection of 100 facts, access tracking on ≤ 1.2× off",
        ("load_inject_100_access", "postgresql_tracking_on"),
        ("load_inject_100_access", "postgresql_tracking_off"),
        1.2,
    ),
    Target(
        "scale",
        "cold load in a many-scope file ≤ 1.5× in a 100-scope file",
        ("scale_cold_load", "many_scopes"),
        ("scale_cold_load", "100_scopes"),
        1.5,
    ),
    Target(
        "sqlite_concurrency",
        "SQLite: 4 processes' throughput / 1 process's (writers serialise)",
        ("concurrent_saves", "sqlite_4proc"),
        ("concurrent_saves", "sqlite_1proc"),
        None,
        throughput=True,
    ),
    Target(
        "pg_concurrency",
        "PostgreSQL: 4 processes' throughput ≥ 1.5× 1 process's",
        ("concurrent_saves", "postgresql_4proc"),
        ("concurrent_saves", "postgresql_1proc"),
        1.5,
        throughput=True,
    ),
    Target(
        "pg_cold_vs_roundtrip",
        "PostgreSQL cold load ≤ 3× one psycopg round trip (SELECT 1)",
        ("load_cold_100", "postgresql"),
        ("load_cold_100", "psycopg_select1"),
        3,
    ),
    Target(
        "rls_cold_load",
        "PostgreSQL cold load, row-level security on ≤ 1.15× off",
        ("tenancy_load_cold_100", "rls_on"),
        ("tenancy_load_cold_100", "rls_off"),
        1.15,
    ),
    Target(
        "rls_save",
        "PostgreSQL save adding a fact to 100, row-level security on ≤ 1.15× off",
        ("tenancy_save_add1_100", "rls_on"),
        ("tenancy_save_add1_100", "rls_off"),
        1.15,
    ),
    Target(
        "context_merge",
        "PostgreSQL: the reader's load + 100 shared and public facts merged vs its load alone",
        ("tenancy_context_merge", "merged_100_shared"),
        ("tenancy_context_merge", "own_only"),
        None,
    ),
    Target(
        "pg_cold_vs_floor",
        "PostgreSQL cold load vs the same query by hand with psycopg",
        ("load_cold_100", "postgresql"),
        ("load_cold_100", "psycopg_floor"),
        None,
    ),
)


LINEAR_GOAL = 0.8
"""The queue's scaling goal: N workers deliver at least 0.8 × N times one worker's throughput."""
QUEUE_LAYOUTS = (("4w", 4, "4 workers"), ("16w", 16, "16 workers"), ("2x8w", 16, "2 processes × 8 workers"))


def _queue_targets() -> tuple[Target, ...]:
    targets = []
    for delay in (1000, 200):
        scenario = f"queue_llm_{delay}ms"
        for backend, name in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
            for label, workers, text in QUEUE_LAYOUTS:
                targets.append(
                    Target(
                        f"queue_{backend}_{delay}ms_{label}",
                        f"{name} queue, LLM {delay} ms: {text} ≥ {LINEAR_GOAL:g} × {workers} × 1 worker",
                        (scenario, f"{backend}_{label}"),
                        (scenario, f"{backend}_1w"),
                        LINEAR_GOAL * workers,
                        throughput=True,
                    )
                )
        targets.append(
            Target(
                f"queue_{delay}ms_vs_memory_queue",
                f"LLM {delay} ms: SQLite queue with 16 workers vs the memory queue (1 worker)",
                (scenario, "sqlite_16w"),
                (scenario, "memory_queue_1w"),
                None,
                throughput=True,
            )
        )
    return tuple(targets)


def _search_targets() -> tuple[Target, ...]:
    targets = []
    for backend, name in (("sqlite", "SQLite"), ("postgresql", "PostgreSQL")):
        subject = (SEARCH_SCENARIO, f"{backend}_fulltext")
        targets.append(
            Target(
                f"search_{backend}",
                f"{name}: full-text search over every user, p50 ≤ 50 ms",
                subject,
                None,
                50,
            )
        )
        for operation, text in (
            ("list_user_category", "facts list by user and category"),
            ("stats", "stats"),
            ("erase_one_user", "erase of one user"),
        ):
            subject = (SEARCH_SCENARIO, f"{backend}_{operation}")
            targets.append(
                Target(f"{operation}_{backend}", f"{name}: {text}, median ms", subject, None, None)
            )
    return tuple(targets)


TARGETS += _queue_targets()
TARGETS += _search_targets()
TARGETS += tuple(Target(**fields) for fields in bench_large_report.target_fields())
TARGETS += tuple(Target(**fields) for fields in bench_sessions.target_fields())
TARGETS += tuple(Target(**fields) for fields in bench_async.target_fields())
TARGETS += tuple(Target(**fields) for fields in bench_lean_report.target_fields())


def _value(result: Result, target: Target) -> float:
    if target.metric is not None:
        return result.extra[target.metric]
    return result.extra["throughput_per_s"] if target.throughput else result.median


def verdicts(results: list[Result]) -> list[dict[str, Any]]:
    """Every target whose variants ran, with its ratio and verdict ("met", "missed" or "info")."""
    index = {(r.scenario, r.variant): r for r in results}
    out: list[dict[str, Any]] = []
    for target in TARGETS:
        subject = index.get(target.subject)
        ref = index.get(target.ref) if target.ref else None
        if subject is None or (target.ref and ref is None):
            continue
        value = _value(subject, target)
        ratio = value / _value(ref, target) if ref else value
        if target.limit is None:
            verdict = "info"
        else:
            met = ratio >= target.limit if target.throughput else ratio <= target.limit
            verdict = "met" if met else "missed"
        out.append(
            {
                "target": target.key,
                "description": target.text,
                "subject": "/".join(target.subject),
                "reference": "/".join(target.ref) if target.ref else "absolute (ms)",
                "ratio": round(ratio, 3),
                "limit": target.limit,
                "verdict": verdict,
            }
        )
    return out


def results_table(results: list[Result]) -> str:
    lines = [
        "| scenario | variant | median ms | p95 ms | n | other | durability |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in results:
        other = ", ".join(f"{key}={value:.4g}" for key, value in r.extra.items())
        lines.append(
            f"| {r.scenario} | {r.variant} | {r.median:.3f} | {r.p95:.3f} | {len(r.samples_ms)} "
            f"| {other} | {r.durability} |"
        )
    return "\n".join(lines)


def queue_table(results: list[Result]) -> str:
    """The queue scenarios in the terms of issue 15; empty when they did not run."""
    lines = [
        "| LLM delay | variant | workers | conversations/s | vs linear | enqueue p50 ms | enqueue p95 ms "
        "| worker CPU ms/conversation | conversations |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if not r.scenario.startswith("queue_llm_"):
            continue
        delay = r.scenario.removeprefix("queue_llm_")
        scaling = r.extra.get("scaling_vs_linear")
        lines.append(
            f"| {delay} | {r.variant} | {r.extra['workers']:.0f} | {r.extra['throughput_per_s']:.2f} "
            f"| {'—' if scaling is None else f'{scaling:.2f}×'} | {r.median:.2f} | {r.p95:.2f} "
            f"| {r.extra['cpu_ms_per_conversation']:.1f} | {r.extra['conversations']:.0f} |"
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def verdict_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| target | ratio | limit | verdict |", "|---|---:|---:|---|"]
    for row in rows:
        unit = " ms" if row["reference"] == "absolute (ms)" else "×"
        limit = "—" if row["limit"] is None else f"{row['limit']:g}{unit}"
        lines.append(f"| {row['description']} | {row['ratio']:.2f}{unit} | {limit} | {row['verdict']} |")
    return "\n".join(lines)


def write_json(path: Path, meta: dict[str, Any], results: list[Result], rows: list[dict[str, Any]]) -> None:
    payload = {"meta": meta, "results": [r.as_json() for r in results], "ratios": rows}
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def merge_json(
    path: Path,
    meta: dict[str, Any],
    results: list[Result],
    rows: list[dict[str, Any]],
    replaces: Callable[[str], bool],
) -> None:
    """Write this partial run's entries into ``path``, replacing the entries of the same scenarios.

    The file's ``meta`` stays the full run's; this run's goes under ``partial_runs``.
    """
    payload: dict[str, Any] = {"meta": {}, "results": [], "ratios": []}
    if path.exists():
        payload = json.loads(path.read_text(encoding="utf-8"))
    payload["results"] = [r for r in payload["results"] if not replaces(r["scenario"])]
    payload["results"] += [r.as_json() for r in results]
    payload["ratios"] = [row for row in payload["ratios"] if not replaces(row["subject"])] + rows
    payload["meta"].setdefault("partial_runs", {})[",".join(sorted({r.scenario for r in results}))] = meta
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_chart(path: Path, results: list[Result], title: str) -> None:
    """One panel per scenario: median bars with a p95 whisker, each panel on its own scale."""
    scenarios = list(dict.fromkeys(r.scenario for r in results))
    columns = 3
    rows = math.ceil(len(scenarios) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(15, 4.2 * rows), squeeze=False)
    for axis, scenario in zip(axes.flat, scenarios, strict=False):
        group = [r for r in results if r.scenario == scenario]
        medians = [r.median for r in group]
        whiskers = [[0.0] * len(group), [r.p95 - r.median for r in group]]
        axis.bar(range(len(group)), medians, yerr=whiskers, capsize=4, color="#4c72b0")
        axis.set_xticks(range(len(group)), [r.variant for r in group], rotation=30, ha="right", fontsize=8)
        axis.set_title(scenario, fontsize=10)
        axis.set_ylabel("ms (median, whisker p95)", fontsize=8)
    for axis in list(axes.flat)[len(scenarios) :]:
        axis.set_visible(False)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(figure)


def write_docs(path: Path, block: str, markers: tuple[str, str] = DOCS_MARKERS) -> None:
    """Replace what lies between ``markers`` in ``path``; the prose around it is left alone."""
    begin, end = markers
    text = path.read_text(encoding="utf-8")
    head, found, rest = text.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found or not found_end:
        raise SystemExit(f"{path} lacks the {begin} ... {end} markers")
    path.write_text(f"{head}{begin}\n{block}\n{end}{tail}", encoding="utf-8")
