"""The lean-path figures' targets and their side-by-side table (baseline | current | goal | verdicts).

Every figure is a ``bench_report.Target`` per tree (``<key>_baseline``, ``<key>_current``), so
``results.json``'s ratios carry each tree's value and verdict; the table pivots those rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from bench_core import Result

MARKERS = ("<!-- bench-lean:begin -->", "<!-- bench-lean:end -->")
TREES = ("baseline", "current")
QUEUE_LAYOUTS = (
    ("sqlite_1w", "Queue, SQLite, 1 worker", 10.0),
    ("postgresql_1w", "Queue, PostgreSQL, 1 worker", 20.0),
)
"""(layout, label, overhead goal in ms)."""
WRITE_TRANSACTIONS_GOAL = 2.0
"""The save's transaction and at most one more (claim and lease) per conversation."""
PG_THROUGHPUT_GOAL = 3.0
COLD_VS_LANGGRAPH_GOAL = 2.0
PG_COLD_VS_ROUND_TRIP_GOAL = 4.0
SAVE_VS_LANGGRAPH_GOAL = 3.0
SAVE_SCALING_GOAL = 1.5
CLI_GOAL_MS = 300.0
LIFECYCLE_GOAL_MS = 5000.0
PG_THROUGHPUT_KEY = "lean_queue_postgresql_1w_vs_baseline"
SMOKE_PROFILES = ["queue_sqlite", "load_sqlite", "save_10", "cli_version", "lifecycle"]
"""One profile of each way of profiling: a smoke run checks the harness, whatever the verdicts."""


@dataclass(frozen=True)
class Figure:
    """One row of the table: the target ``key`` (per tree, or ``shared`` for one ratio between the
    trees), how to show its value, and which profile explains a miss."""

    key: str
    label: str
    goal: str
    unit: str
    profile: str | None = None
    shared: bool = False
    scale: float = 1.0


def _queue_targets(
    layout: str, label: str, overhead_goal: float
) -> tuple[list[dict[str, Any]], list[Figure]]:
    scenario = f"lean_queue_{layout}"
    targets: list[dict[str, Any]] = []
    backend = layout.split("_")[0]
    profile = f"queue_{backend}"
    metrics = (
        ("statements", "SQL statements per conversation", "statements_per_conversation", None, "", None),
        (
            "write_tx",
            "write transactions per conversation",
            "write_transactions_per_conversation",
            WRITE_TRANSACTIONS_GOAL,
            "",
            profile,
        ),
        ("overhead", "time beyond the LLM per conversation", "overhead_ms", overhead_goal, " ms", profile),
    )
    figures = []
    for name, text, metric, limit, unit, explain in metrics:
        key = f"lean_queue_{name}_{layout}"
        goal = "reported" if limit is None else f"≤ {limit:g}{unit}"
        figures.append(Figure(key, f"{label}: {text}", goal, unit, explain))
        for tree in TREES:
            targets.append(
                {
                    "key": f"{key}_{tree}",
                    "text": f"{label} ({tree}): {text}, {goal}",
                    "subject": (scenario, tree),
                    "ref": None,
                    "limit": limit,
                    "metric": metric,
                }
            )
    return targets, figures


def _throughput_targets() -> tuple[list[dict[str, Any]], list[Figure]]:
    targets: list[dict[str, Any]] = []
    figures = []
    for layout, label in (
        ("sqlite_1w", "SQLite, 1 worker"),
        ("postgresql_1w", "PostgreSQL, 1 worker"),
        ("postgresql_8w", "PostgreSQL, 8 workers"),
    ):
        key = f"lean_queue_throughput_{layout}"
        figures.append(Figure(key, f"Queue, {label}: instant-LLM conversations/s", "reported", "/s"))
        for tree in TREES:
            targets.append(
                {
                    "key": f"{key}_{tree}",
                    "text": f"Queue, {label} ({tree}): instant-LLM conversations/s",
                    "subject": (f"lean_queue_{layout}", tree),
                    "ref": None,
                    "limit": None,
                    "metric": "throughput_per_s",
                }
            )
    text = f"Queue, PostgreSQL, 1 worker: instant-LLM throughput ≥ {PG_THROUGHPUT_GOAL:g}× the baseline's"
    targets.append(
        {
            "key": PG_THROUGHPUT_KEY,
            "text": text,
            "subject": ("lean_queue_postgresql_1w", "current"),
            "ref": ("lean_queue_postgresql_1w", "baseline"),
            "limit": PG_THROUGHPUT_GOAL,
            "throughput": True,
        }
    )
    figures.append(
        Figure(
            PG_THROUGHPUT_KEY,
            "Queue, PostgreSQL, 1 worker: throughput vs the baseline's",
            f"≥ {PG_THROUGHPUT_GOAL:g}×",
            "×",
            "queue_postgresql",
            shared=True,
        )
    )
    return targets, figures


class _Row(NamedTuple):
    """A load, save, start-up or lifecycle figure: ``scenario``'s tree variant against ``ref``
    (``(scenario, variant)``; ``TREE`` stands for the same tree) or, without one, its median."""

    key: str
    label: str
    scenario: str
    ref: tuple[str, str] | None = None
    limit: float | None = None
    unit: str = " ms"
    profile: str | None = None
    scale: float = 1.0


TREE = "{tree}"
_ROWS = (
    _Row("lean_cold_ms", "Cold load of 100 facts, SQLite: median", "lean_load_cold_100"),
    _Row(
        "lean_cold_vs_langgraph",
        "Cold load of 100 facts, SQLite: vs LangGraph SqliteStore get",
        "lean_load_cold_100",
        ("lean_load_cold_100", "langgraph_sqlite"),
        COLD_VS_LANGGRAPH_GOAL,
        "×",
        "load_sqlite",
    ),
    _Row("lean_pg_cold_ms", "Cold load of 100 facts, PostgreSQL: median", "lean_load_cold_100_pg"),
    _Row(
        "lean_pg_cold_vs_round_trip",
        "Cold load of 100 facts, PostgreSQL: vs one psycopg round trip (SELECT 1)",
        "lean_load_cold_100_pg",
        ("lean_load_cold_100_pg", "psycopg_select1"),
        PG_COLD_VS_ROUND_TRIP_GOAL,
        "×",
        "load_postgresql",
    ),
    _Row("lean_save_10_ms", "Save of one more fact at 10 facts: median", "lean_save_add1_10"),
    _Row(
        "lean_save_10_vs_langgraph",
        "Save of one more fact at 10 facts: vs LangGraph put",
        "lean_save_add1_10",
        ("lean_save_add1_10", "langgraph_sqlite"),
        SAVE_VS_LANGGRAPH_GOAL,
        "×",
        "save_10",
    ),
    _Row("lean_save_500_ms", "Save of one more fact at 500 facts: median", "lean_save_add1_500"),
    _Row(
        "lean_save_500_vs_langgraph",
        "Save of one more fact at 500 facts: vs LangGraph put",
        "lean_save_add1_500",
        ("lean_save_add1_500", "langgraph_sqlite"),
        SAVE_VS_LANGGRAPH_GOAL,
        "×",
        "save_500",
    ),
    _Row(
        "lean_save_scaling",
        "Save of one more fact: 500 facts vs 10",
        "lean_save_add1_500",
        ("lean_save_add1_10", TREE),
        SAVE_SCALING_GOAL,
        "×",
        "save_500",
    ),
    _Row(
        "lean_cli_version",
        "`memstore --version`, fresh interpreter",
        "lean_cli_version",
        limit=CLI_GOAL_MS,
        unit=" s",
        profile="cli_version",
        scale=1000.0,
    ),
    _Row(
        "lean_cli_help",
        "`memstore --help`, fresh interpreter",
        "lean_cli_help",
        limit=CLI_GOAL_MS,
        unit=" s",
        profile="cli_help",
        scale=1000.0,
    ),
    _Row(
        "lean_lifecycle",
        "`memstore lifecycle run --dry-run --below 0.5`",
        "lean_lifecycle_dry_run",
        limit=LIFECYCLE_GOAL_MS,
        unit=" s",
        profile="lifecycle",
        scale=1000.0,
    ),
    _Row(
        "lean_lifecycle_json",
        "the same with `--json`",
        "lean_lifecycle_dry_run_json",
        limit=LIFECYCLE_GOAL_MS,
        unit=" s",
        profile="lifecycle_json",
        scale=1000.0,
    ),
)


def _store_targets() -> tuple[list[dict[str, Any]], list[Figure]]:
    targets: list[dict[str, Any]] = []
    figures = []
    for row in _ROWS:
        if row.limit is None:
            goal = "reported"
        elif row.unit == " s":
            goal = f"< {row.limit / row.scale:g} s"
        else:
            goal = f"≤ {row.limit:g}×"
        figures.append(Figure(row.key, row.label, goal, row.unit, row.profile, scale=row.scale))
        for tree in TREES:
            ref = (row.ref[0], row.ref[1].format(tree=tree)) if row.ref else None
            targets.append(
                {
                    "key": f"{row.key}_{tree}",
                    "text": f"{row.label} ({tree}), {goal}",
                    "subject": (row.scenario, tree),
                    "ref": ref,
                    "limit": row.limit,
                }
            )
    return targets, figures


def _all() -> tuple[list[dict[str, Any]], list[Figure]]:
    targets: list[dict[str, Any]] = []
    figures: list[Figure] = []
    for made in (
        *(_queue_targets(*layout) for layout in QUEUE_LAYOUTS),
        _throughput_targets(),
        _store_targets(),
    ):
        targets += made[0]
        figures += made[1]
    return targets, figures


TARGET_FIELDS, FIGURES = _all()


def target_fields() -> list[dict[str, Any]]:
    """``bench_report.Target``'s fields for every lean figure and tree."""
    return TARGET_FIELDS


def missed_profiles(rows: list[dict[str, Any]]) -> list[str]:
    """The profiles that explain the current tree's missed goals, in the table's order."""
    verdicts = {row["target"]: row["verdict"] for row in rows}
    kinds: list[str] = []
    for figure in FIGURES:
        key = figure.key if figure.shared else f"{figure.key}_current"
        if verdicts.get(key) == "missed" and figure.profile and figure.profile not in kinds:
            kinds.append(figure.profile)
    return kinds


def _shown(row: dict[str, Any] | None, figure: Figure) -> str:
    if row is None:
        return "—"
    value = row["ratio"] / figure.scale
    if figure.unit == "×":
        return f"{value:.2f}×"
    if figure.unit == " s":
        return f"{value:.2f} s"
    return f"{value:.1f}{figure.unit}"


def lean_table(rows: list[dict[str, Any]]) -> str:
    """Baseline and current side by side, one line per figure that ran; empty if none did."""
    index = {row["target"]: row for row in rows}
    lines = [
        "| figure | baseline | current | goal | verdict (baseline → current) |",
        "|---|---:|---:|---|---|",
    ]
    for figure in FIGURES:
        if figure.shared:
            row = index.get(figure.key)
            if row is not None:
                lines.append(
                    f"| {figure.label} | | {_shown(row, figure)} | {figure.goal} | {row['verdict']} |"
                )
            continue
        found = [index.get(f"{figure.key}_{tree}") for tree in TREES]
        if found == [None, None]:
            continue
        verdict = " → ".join(row["verdict"] if row else "—" for row in found)
        if all(row is not None and row["verdict"] == "info" for row in found):
            verdict = ""
        baseline, current = (_shown(row, figure) for row in found)
        lines.append(f"| {figure.label} | {baseline} | {current} | {figure.goal} | {verdict} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def details_table(results: list[Result]) -> str:
    """Every lean scenario and variant: median, p95, samples, and the counted extras."""
    lines = ["| scenario | variant | median ms | p95 ms | n | other |", "|---|---|---:|---:|---:|---|"]
    for r in results:
        other = ", ".join(f"{key}={value:.4g}" for key, value in r.extra.items())
        lines.append(
            f"| {r.scenario} | {r.variant} | {r.median:.3f} | {r.p95:.3f} | {len(r.samples_ms)} | {other} |"
        )
    return "\n".join(lines)


def profiles_text(profiles: dict[str, str]) -> str:
    """Each profile as a collapsed block: the current tree's, behind a goal it still misses."""
    return "\n\n".join(
        f"<details><summary>Profile: {kind} (current tree)</summary>\n\n```text\n{body}\n```\n\n</details>"
        for kind, body in profiles.items()
    )


def lean_parts(results: list[Result], rows: list[dict[str, Any]], summary: dict[str, Any]) -> tuple[str, ...]:
    """The lean region's parts after the run's header: which trees, the side-by-side table, every
    variant's figures, the profiles."""
    trees = summary.get("trees", {})
    described = f"Baseline: {trees.get('baseline', '?')}; current: {trees.get('current', '?')}."
    return (described, lean_table(rows), details_table(results), profiles_text(summary.get("profiles", {})))
