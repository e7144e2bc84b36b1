"""``scripts/bench.py --smoke`` end to end: the outputs are complete. Timings are never asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = (ROOT / "bench" / "results.json", ROOT / "bench" / "chart.png", ROOT / "docs" / "performance.md")
"""What only ``--write-docs`` may rewrite."""
SEARCH_OPERATIONS = ("fulltext", "list_user_category", "stats", "erase_one_user")
LARGE_STORAGE = (
    "large_cold_load",
    "large_inject",
    "large_inject_local",
    "large_inject_local_uncached",
    "large_save_add1",
    "large_save_evict",
)
LARGE_SIZES = (1000, 5000, 10_000)
SESSION_SCENARIOS = (
    "session_append_2turns",
    "session_context",
    "session_compress_10turns_extract_off",
    "session_compress_10turns_extract_on",
)

ASYNC_CONTEXT = "async_memory_context_burst"
ASYNC_STORE = tuple(f"async_store_{op}_{mode}" for op in ("put", "get", "search") for mode in ("seq", "c20"))


def _async_targets(backend: str) -> set[str]:
    """``bench_async``'s ratios on ``backend``: async face vs thread pool, each store figure of
    memstore's vs LangGraph's."""
    store = {f"{scenario.removeprefix('async_')}_{backend}_vs_langgraph" for scenario in ASYNC_STORE}
    return {f"async_face_vs_thread_pool_{backend}", *store}


SQLITE_VARIANTS = {
    "load_warm_100": {"sqlite", "file"},
    "load_cold_100": {"sqlite", "sqlite3_floor", "langgraph_sqlite", "file"},
    **{
        f"save_add1_{size}": {"sqlite", "sqlite_sync_full", "file", "langgraph_sqlite"}
        for size in (10, 100, 500)
    },
    "inject_500": {"tiktoken", "tiktoken_uncached", "char_estimate"},
    "load_inject_100_access": {"sqlite_tracking_off", "sqlite_tracking_on"},
    # CI installs the local-embeddings extra and pysqlite3, so neither optional variant may vanish.
    "inject_query_500": {"confidence_order", "query_aware", "local_query_embedding"},
    "semantic_search_100k": {"sqlite_exact", "sqlite_exact_one_user", "sqlite_vec", "sqlite_vec_one_user"},
    "scale_cold_load": {"100_scopes", "many_scopes"},
    "concurrent_saves": {"sqlite_1proc", "sqlite_4proc"},
    "queue_llm_200ms": {"sqlite_1w", "sqlite_4w", "sqlite_16w", "sqlite_2x8w", "memory_queue_1w"},
    "search_at_scale": {f"sqlite_{operation}" for operation in SEARCH_OPERATIONS},
    **{scenario: {f"sqlite_{size}" for size in LARGE_SIZES} for scenario in LARGE_STORAGE},
    **{
        scenario: {f"facts_{size}" for size in LARGE_SIZES}
        for scenario in ("large_update_prompt", "large_update_apply")
    },
    **{scenario: {"sqlite"} for scenario in SESSION_SCENARIOS},
    ASYNC_CONTEXT: {"sqlite_async_face", "sqlite_thread_pool"},
    **{scenario: {"sqlite_memstore", "sqlite_langgraph"} for scenario in ASYNC_STORE},
}
PG_VARIANTS = {
    "load_warm_100": {"postgresql"},
    "load_cold_100": {"postgresql", "psycopg_floor", "psycopg_select1"},
    "load_inject_100_access": {"postgresql_tracking_off", "postgresql_tracking_on"},
    **{f"save_add1_{size}": {"postgresql"} for size in (10, 100, 500)},
    "semantic_search_100k": {"postgresql_exact", "postgresql_exact_one_user"},
    "concurrent_saves": {"postgresql_1proc", "postgresql_4proc"},
    "queue_llm_200ms": {"postgresql_1w", "postgresql_4w", "postgresql_16w", "postgresql_2x8w"},
    "search_at_scale": {f"postgresql_{operation}" for operation in SEARCH_OPERATIONS},
    "tenancy_load_cold_100": {"rls_off", "rls_on"},
    "tenancy_save_add1_100": {"rls_off", "rls_on"},
    "tenancy_context_merge": {"own_only", "merged_100_shared"},
    **{scenario: {f"postgresql_{size}" for size in LARGE_SIZES} for scenario in LARGE_STORAGE},
    **{scenario: {"postgresql"} for scenario in SESSION_SCENARIOS},
    ASYNC_CONTEXT: {"postgresql_async_face", "postgresql_thread_pool"},
    **{scenario: {"postgresql_memstore", "postgresql_langgraph"} for scenario in ASYNC_STORE},
}
REDIS_VARIANTS = {scenario: {"redis"} for scenario in SESSION_SCENARIOS}
QUEUE_LAYOUTS = {"1w": 1, "4w": 4, "16w": 16, "2x8w": 16}
SQLITE_TARGETS = {
    "warm_load",
    "cold_vs_floor",
    "cold_vs_langgraph",
    "save_scaling",
    "save_vs_langgraph_10",
    "save_vs_langgraph_500",
    "save_vs_file",
    "save_vs_file_same_durability",
    "inject",
    "inject_query",
    "inject_query_vs_confidence",
    "semantic_search_vec",
    "access_tracking",
    "scale",
    "sqlite_concurrency",
    *(f"queue_sqlite_200ms_{layout}" for layout in ("4w", "16w", "2x8w")),
    "queue_200ms_vs_memory_queue",
    "search_sqlite",
    *(f"{operation}_sqlite" for operation in SEARCH_OPERATIONS[1:]),
    *(f"{scenario}_sqlite" for scenario in LARGE_STORAGE),
    "large_update_prompt",
    "large_update_apply",
    "large_update_prompt_size",
    *_async_targets("sqlite"),
}
PG_TARGETS = {
    "pg_concurrency",
    "pg_cold_vs_roundtrip",
    "pg_cold_vs_floor",
    "pg_access_tracking",
    "rls_cold_load",
    "rls_save",
    "context_merge",
    *(f"queue_postgresql_200ms_{layout}" for layout in ("4w", "16w", "2x8w")),
    "search_postgresql",
    *(f"{operation}_postgresql" for operation in SEARCH_OPERATIONS[1:]),
    *(f"{scenario}_postgresql" for scenario in LARGE_STORAGE),
    *(f"{scenario}_postgresql_vs_sqlite" for scenario in SESSION_SCENARIOS),
    *_async_targets("postgresql"),
}
REDIS_TARGETS = {f"{scenario}_redis_vs_sqlite" for scenario in SESSION_SCENARIOS}
TREES = {"baseline", "current"}
LEAN_VARIANTS = {
    "lean_queue_sqlite_1w": TREES,
    "lean_load_cold_100": TREES | {"langgraph_sqlite"},
    "lean_save_add1_10": TREES | {"langgraph_sqlite"},
    "lean_save_add1_500": TREES | {"langgraph_sqlite"},
    "lean_cli_version": TREES,
    "lean_cli_help": TREES,
    "lean_lifecycle_dry_run": TREES,
    "lean_lifecycle_dry_run_json": TREES,
}
LEAN_PG_VARIANTS = {
    "lean_queue_postgresql_1w": TREES,
    "lean_queue_postgresql_8w": TREES,
    "lean_load_cold_100_pg": TREES | {"psycopg_select1"},
}
LEAN_PROFILES = {"queue_sqlite", "load_sqlite", "save_10", "cli_version", "lifecycle"}
"""A smoke run profiles one figure of each kind, whatever the verdicts."""


def test_smoke_run_reports_every_scenario_variant_and_ratio(tmp_path: Path) -> None:
    env, pg_server = _bench_env()
    # Redis as PostgreSQL; without the suite's server the benchmark must not pick one up on its own.
    redis_server = os.environ.get("MEMSTORE_TEST_REDIS_URL")
    env["MEMSTORE_BENCH_REDIS_URL"] = redis_server or "off"
    published = {path: path.read_bytes() for path in PUBLISHED}
    result = _bench("--smoke", cwd=tmp_path, env=env)  # no --out, no --write-docs: into .bench/
    assert result.returncode == 0, result.stderr
    assert {path: path.read_bytes() for path in PUBLISHED} == published  # the checkout stays clean
    for name in ("results.json", "chart.png"):
        (tmp_path / name).write_bytes((ROOT / ".bench" / name).read_bytes())
    payload = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))

    expected = {scenario: set(variants) for scenario, variants in SQLITE_VARIANTS.items()}
    targets = set(SQLITE_TARGETS)
    if pg_server:
        for scenario, variants in PG_VARIANTS.items():
            expected[scenario] = expected.get(scenario, set()) | variants
        targets |= PG_TARGETS
    else:
        assert "PostgreSQL scenarios skipped" in result.stdout
    if redis_server:
        for scenario, variants in REDIS_VARIANTS.items():
            expected[scenario] = expected.get(scenario, set()) | variants
        targets |= REDIS_TARGETS
    else:
        assert "Redis session scenarios skipped" in result.stdout
    seen: dict[str, set[str]] = {}
    for row in payload["results"]:
        seen.setdefault(row["scenario"], set()).add(row["variant"])
        assert isinstance(row["median_ms"], float | int) and isinstance(row["p95_ms"], float | int)
        assert row["p95_ms"] >= row["median_ms"] >= 0
        assert row["durability"]
        if row["scenario"].startswith("queue_llm_"):
            _check_queue_row(row)
        if row["scenario"].startswith("async_"):
            _check_async_row(row)
    assert seen == expected
    ratios = {row["target"]: row for row in payload["ratios"]}
    assert set(ratios) == targets
    for row in ratios.values():
        assert isinstance(row["ratio"], float | int) and row["ratio"] > 0
        assert row["verdict"] in {"met", "missed", "info"}
    assert "smoke mode: the scale scenario used" in result.stdout
    assert "| 200ms | sqlite_16w | 16 |" in result.stdout  # the queue's own table
    assert "| append a user + assistant pair (one call, 2 turns), p50 | 5 |" in result.stdout  # sessions'
    assert "| memory_context burst | SQLite | async_face |" in result.stdout  # the async scenarios'
    assert "| store search, 20 at a time | SQLite | memstore |" in result.stdout
    assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    # --only queue replaces the queue's entries and keeps every other scenario's.
    chart = (tmp_path / "chart.png").read_bytes()
    rerun = _bench("--smoke", "--only", "queue", "--out", str(tmp_path), cwd=tmp_path, env=env)
    assert rerun.returncode == 0, rerun.stderr
    merged = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert merged["meta"]["generated_at"] == payload["meta"]["generated_at"]
    assert set(merged["meta"]["partial_runs"]) == {"queue_llm_200ms"}
    pairs = [(row["scenario"], row["variant"]) for row in merged["results"]]
    assert sorted(pairs) == sorted((row["scenario"], row["variant"]) for row in payload["results"])
    assert {row["target"] for row in merged["ratios"]} == targets
    assert "load_warm_100" not in rerun.stdout and "| 200ms | sqlite_1w | 1 |" in rerun.stdout
    assert (tmp_path / "chart.png").read_bytes() == chart


def test_lean_smoke_run_measures_both_trees_side_by_side(tmp_path: Path) -> None:
    """``--only lean --smoke``: both trees (the checkout twice, no git archive) through every figure,
    each row with its verdicts, the profiles, and ``results.json``'s ``lean`` key."""
    env, pg_server = _bench_env()
    published = {path: path.read_bytes() for path in PUBLISHED}
    result = _bench("--smoke", "--only", "lean", "--out", str(tmp_path), cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert {path: path.read_bytes() for path in PUBLISHED} == published
    payload = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    expected = LEAN_VARIANTS | (LEAN_PG_VARIANTS if pg_server else {})
    seen: dict[str, set[str]] = {}
    for row in payload["results"]:
        seen.setdefault(row["scenario"], set()).add(row["variant"])
        assert row["p95_ms"] >= row["median_ms"] > 0
        if row["scenario"].startswith("lean_queue_"):
            assert row["statements_per_conversation"] > 0 and row["write_transactions_per_conversation"] >= 1
            assert row["throughput_per_s"] > 0 and row["conversations"] >= row["workers"]
            assert ("overhead_ms" in row) == (row["workers"] == 1)
    assert seen == expected
    lean = payload["lean"]
    assert set(lean["trees"]) == TREES and "smoke" in lean["trees"]["baseline"]
    assert set(lean["profiles"]) == LEAN_PROFILES and all(lean["profiles"].values())
    verdicts = {row["target"]: row["verdict"] for row in lean["figures"]}
    assert verdicts == {row["target"]: row["verdict"] for row in payload["ratios"]}
    for tree in TREES:
        assert verdicts[f"lean_cold_vs_langgraph_{tree}"] in {"met", "missed"}
        assert verdicts[f"lean_queue_write_tx_sqlite_1w_{tree}"] in {"met", "missed"}
        assert verdicts[f"lean_lifecycle_json_{tree}"] in {"met", "missed"}
    assert ("lean_queue_postgresql_1w_vs_baseline" in verdicts) == bool(pg_server)
    assert "| figure | baseline | current | goal | verdict (baseline → current) |" in result.stdout
    assert "| `memstore --version`, fresh interpreter |" in result.stdout
    if not pg_server:
        assert "PostgreSQL scenarios skipped" in result.stdout


def _check_async_row(row: dict[str, Any]) -> None:
    """An async variant reports its p99, its throughput and its CPU per call, over every round."""
    assert row["p99_ms"] >= row["p95_ms"] - 0.001  # results.json rounds extras to 3 decimals
    assert row["throughput_per_s"] > 0 and row["cpu_ms_per_call"] >= 0
    assert row["rounds"] >= 1 and row["concurrency"] >= 1
    if row["scenario"].endswith("_seq"):
        assert row["concurrency"] == 1


def _check_queue_row(row: dict[str, Any]) -> None:
    """A queue variant reports throughput, CPU per conversation and, but the baseline, its scaling."""
    backend, layout = row["variant"].rsplit("_", 1)
    assert row["throughput_per_s"] > 0 and row["cpu_ms_per_conversation"] > 0
    assert row["conversations"] >= row["workers"] >= 1
    if backend == "memory_queue":
        assert "scaling_vs_linear" not in row and row["workers"] == 1
    else:
        assert row["workers"] == QUEUE_LAYOUTS[layout]
        assert row["scaling_vs_linear"] > 0
        if layout == "1w":
            assert row["scaling_vs_linear"] == 1


def test_quick_and_smoke_are_exclusive() -> None:
    result = _bench("--quick", "--smoke", timeout=60)
    assert result.returncode == 2 and "not allowed with" in result.stderr


def _bench_env() -> tuple[dict[str, str], str | None]:
    """The environment without memstore's settings, and the suite's PostgreSQL server (then also the
    benchmark's, so the PostgreSQL half of the harness is exercised too)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MEMSTORE_")}
    pg_server = os.environ.get("MEMSTORE_TEST_PG_URL")
    if pg_server:
        env["MEMSTORE_BENCH_PG_URL"] = pg_server
    return env, pg_server


def _bench(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
