"""Issue 37's acceptance: the lean-path figures, a baseline revision and the checkout side by side.

``scripts/bench.py --only lean [--baseline REV]`` exports the baseline (``git archive REV``, into
the scratch directory: the repository's git state is never touched) and runs every measurement in
a child process (``bench_lean_child.py``, or ``memstore`` itself) whose ``PYTHONPATH`` is one tree
or the other. The trees alternate round by round (baseline, current, current, baseline, ...), so
both meet the same machine load. Each tree has its own SQLite files and PostgreSQL database,
migrated by its own code. The figures: the durable queue per conversation against an instant LLM
(statements and write transactions counted with SQLAlchemy's events, time beyond the LLM,
throughput), the cold load of 100 facts and the save of one more fact beside LangGraph's
``SqliteStore`` and one psycopg round trip, ``memstore --version`` and ``--help`` in a fresh
interpreter, and ``memstore lifecycle run --dry-run --below 0.5`` over 100,000 facts. For every
goal the current tree still misses, the current tree's profile is added.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_lean_cli
import bench_lean_report
import bench_report
from bench_core import SQLITE_NORMAL, Result
from bench_data import document, fact
from bench_lean_cli import TREES, Tree, child, order, say
from bench_pg import empty_database
from bench_queue import llm_server

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = "7ef25c6"
SCENARIO_PREFIX = "lean_"
SEED_FACTS = 20


@dataclass(frozen=True)
class LeanMode:
    queue_rounds: int
    conversations: tuple[tuple[str, int, int], ...]
    """(layout, worker threads, conversations per run): SQLite 1 worker, PostgreSQL 1 and 8."""
    store_rounds: int
    loads: int
    saves: int
    warmup: int
    cli_rounds: int
    lifecycle_facts: int
    profile_conversations: int


LEAN_MODES = {
    "full": LeanMode(
        queue_rounds=3,
        conversations=(("sqlite_1w", 1, 60), ("postgresql_1w", 1, 40), ("postgresql_8w", 8, 96)),
        store_rounds=3,
        loads=300,
        saves=60,
        warmup=20,
        cli_rounds=8,
        lifecycle_facts=100_000,
        profile_conversations=20,
    ),
    "quick": LeanMode(
        queue_rounds=2,
        conversations=(("sqlite_1w", 1, 30), ("postgresql_1w", 1, 20), ("postgresql_8w", 8, 48)),
        store_rounds=2,
        loads=150,
        saves=30,
        warmup=10,
        cli_rounds=4,
        lifecycle_facts=20_000,
        profile_conversations=10,
    ),
    "smoke": LeanMode(
        queue_rounds=1,
        conversations=(("sqlite_1w", 1, 3), ("postgresql_1w", 1, 3), ("postgresql_8w", 8, 12)),
        store_rounds=1,
        loads=5,
        saves=3,
        warmup=1,
        cli_rounds=1,
        lifecycle_facts=300,
        profile_conversations=2,
    ),
}


def _git(*args: str) -> str:
    """A read-only git command on the checkout (no optional locks: status never rewrites the index)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    done = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


@contextmanager
def baseline_tree(revision: str | None, work: Path) -> Iterator[tuple[Path, str]]:
    """The baseline's ``memstore/`` and ``alembic/``, exported with ``git archive``; ``None``: the
    checkout itself (smoke runs, which check the harness, not the figures)."""
    if revision is None:
        yield ROOT, "the checkout itself (smoke: harness check only)"
        return
    target = work / "baseline-tree"
    target.mkdir()
    sha = _git("rev-parse", "--verify", f"{revision}^{{commit}}")
    archive = subprocess.Popen(
        ["git", "-C", str(ROOT), "archive", "--format=tar", sha, "memstore", "alembic"],
        stdout=subprocess.PIPE,
    )
    subprocess.run(["tar", "-x", "-C", str(target)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {revision} failed")
    try:
        yield target, f"{sha[:7]} (git archive)"
    finally:
        shutil.rmtree(target, ignore_errors=True)


def describe_checkout() -> str:
    """Which code "current" was: HEAD, and whether tracked files differ from it."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "the checkout (no git metadata)"  # a source copy: a smoke run needs no git
    return f"the checkout: HEAD {head}" + (" with uncommitted changes" if dirty else "")


# -- the durable queue -----------------------------------------------------------------------


def queue_figures(trees: dict[str, Tree], mode: LeanMode, pg_durability: str) -> list[Result]:
    totals: dict[tuple[str, str], dict[str, float]] = {}
    samples: dict[tuple[str, str], list[float]] = {}
    seed = document(SEED_FACTS)
    with llm_server() as server:
        for round_index in range(mode.queue_rounds):
            for name in order(round_index):
                tree = trees[name]
                # One child per database: the updater saves through the process's one storage.
                runs: dict[str, list[dict[str, Any]]] = {}
                for layout, workers, count in mode.conversations:
                    url = tree.sqlite_url if layout.startswith("sqlite") else tree.pg_url
                    if url is not None:
                        tag = f"q{round_index}-{layout}"
                        run = {"layout": layout, "workers": workers, "conversations": count, "tag": tag}
                        runs.setdefault(url, []).append(run)
                for url, specs in runs.items():
                    task = {
                        "task": "queue",
                        "url": url,
                        "llm": f"{server}/d0/v1",
                        "seed": seed,
                        "runs": specs,
                    }
                    for spec, run in zip(specs, child(tree, task)["runs"], strict=True):
                        key = (spec["layout"], name)
                        total = totals.setdefault(key, {})
                        for field_name, value in run.items():
                            total[field_name] = total.get(field_name, 0.0) + value
                        samples.setdefault(key, []).append(1000 * run["seconds"] / run["conversations"])
            say(f"queue round {round_index + 1} of {mode.queue_rounds} done")
    results = []
    for (layout, name), total in totals.items():
        conversations = total["conversations"]
        extra = {
            "workers": float(layout.rsplit("_", 1)[1].removesuffix("w")),
            "conversations": conversations,
            "throughput_per_s": conversations / total["seconds"],
            "llm_ms_per_conversation": 1000 * total["llm_seconds"] / conversations,
            **{
                f"{count}_per_conversation": (total[count] - total[f"warm_{count}"])
                / (conversations - total["warm_conversations"])
                for count in ("statements", "transactions", "write_transactions")
            },
        }
        if extra["workers"] == 1:
            extra["overhead_ms"] = 1000 * (total["seconds"] - total["llm_seconds"]) / conversations
        durability = SQLITE_NORMAL if layout.startswith("sqlite") else pg_durability
        results.append(Result(f"lean_queue_{layout}", name, durability, samples[(layout, name)], extra))
    return results


# -- cold load and save -----------------------------------------------------------------------


def _store_docs(mode: LeanMode) -> dict[str, Any]:
    extra = [fact(1_000_000 + index) for index in range(4 * (mode.saves + 3))]
    return {"10": document(10), "100": document(100), "500": document(500), "extra": extra}


def store_figures(trees: dict[str, Tree], mode: LeanMode, pg_durability: str) -> list[Result]:
    docs = _store_docs(mode)
    pooled: dict[tuple[str, str], list[float]] = {}
    for round_index in range(mode.store_rounds):
        for name in order(round_index):
            tree = trees[name]
            task = {"task": "store", "sqlite_url": tree.sqlite_url, "pg_url": tree.pg_url, "docs": docs}
            task |= {"iterations": mode.loads, "warmup": mode.warmup, "saves": mode.saves}
            task |= {
                "tag": f"s{round_index}",
                "langgraph_path": str(tree.work / f"langgraph-{round_index}.db"),
            }
            for scenario, variants in child(tree, task).items():
                for variant, values in variants.items():
                    label = name if variant == "memstore" else variant
                    pooled.setdefault((scenario, label), []).extend(values)
        say(f"loads and saves round {round_index + 1} of {mode.store_rounds} done")
    results = []
    for (scenario, variant), values in pooled.items():
        durability = pg_durability if scenario.endswith("_pg") else SQLITE_NORMAL
        results.append(Result(f"lean_{scenario}", variant, durability, values))
    return results


def _profile_task(kind: str, tree: Tree, mode: LeanMode, llm: str) -> dict[str, Any]:
    """The ``profile`` child's work for a queue, load or save figure."""
    backend = kind.rsplit("_", 1)[1]
    url = tree.pg_url if backend == "postgresql" else tree.sqlite_url
    task = {"url": url, "tag": f"profile-{kind}", "lines": bench_lean_cli.PROFILE_LINES}
    if kind.startswith("queue_"):
        conversations = mode.profile_conversations
        return task | {
            "what": "queue",
            "llm": llm,
            "conversations": conversations,
            "seed": document(SEED_FACTS),
        }
    if kind.startswith("load_"):
        return task | {"what": "load", "doc": document(100), "iterations": mode.loads}
    extra = [fact(2_000_000 + index) for index in range(mode.saves + 1)]
    return task | {"what": "save", "doc": document(int(backend)), "extra": extra, "iterations": mode.saves}


def profiles(kinds: list[str], tree: Tree, mode: LeanMode) -> dict[str, str]:
    """Each kind's profile on ``tree``: ``-X importtime`` for start-up, cProfile of the command in a
    fresh interpreter for the lifecycle, and cProfile in a child per database for the rest (the
    updater saves through the process's one storage, built for the first database it met)."""
    found: dict[str, str] = {}
    in_child = [kind for kind in kinds if kind.split("_")[0] in ("queue", "load", "save")]
    if in_child:
        with llm_server() as server:
            by_url: dict[str, list[tuple[str, dict[str, Any]]]] = {}
            for kind in in_child:
                item = _profile_task(kind, tree, mode, f"{server}/d0/v1")
                by_url.setdefault(item["url"], []).append((kind, item))
            for pairs in by_url.values():
                texts = child(tree, {"task": "profile", "items": [item for _, item in pairs]})["profiles"]
                for (kind, _), text in zip(pairs, texts, strict=True):
                    found[kind] = bench_lean_cli.trim_profile(text, tree.root)
    found |= bench_lean_cli.cli_profiles([kind for kind in kinds if kind not in in_child], tree)
    return {kind: found[kind] for kind in kinds}


# -- the whole scenario -----------------------------------------------------------------------


def lean(
    mode_name: str, work: Path, pg_server: str | None, pg_durability: str, baseline: str | None
) -> tuple[list[Result], dict[str, Any]]:
    """Every lean figure for both trees, the profiles behind the current tree's missed goals (every
    kind in smoke mode, which checks the harness), and the run's description: ``results.json``'s
    ``lean`` key."""
    mode = LEAN_MODES[mode_name]
    smoke = mode_name == "smoke"
    revision = baseline if baseline is not None else (None if smoke else DEFAULT_BASELINE)
    with ExitStack() as stack:
        root, described = stack.enter_context(baseline_tree(revision, work))
        roots = {"baseline": root, "current": ROOT}
        trees: dict[str, Tree] = {}
        for name in TREES:
            pg_url = stack.enter_context(empty_database(pg_server)) if pg_server else None
            (work / name).mkdir()
            trees[name] = Tree(name, roots[name], work / name, pg_url)
        started = time.perf_counter()
        results = queue_figures(trees, mode, pg_durability)
        results += store_figures(trees, mode, pg_durability)
        results += bench_lean_cli.cli_figures(trees, mode.cli_rounds)
        results += bench_lean_cli.lifecycle_figures(trees, mode.lifecycle_facts)
        rows = bench_report.verdicts(results)
        kinds = bench_lean_report.SMOKE_PROFILES if smoke else bench_lean_report.missed_profiles(rows)
        found = profiles(kinds, trees["current"], mode)
        say(f"{len(found)} profile(s) of the current tree done")
        say(f"done in {time.perf_counter() - started:.1f} s")
    summary = {
        "trees": {"baseline": described, "current": describe_checkout()},
        "profiles": found,
        "notes": _notes(mode_name, mode),
    }
    return results, summary


def _notes(mode_name: str, mode: LeanMode) -> list[str]:
    notes = []
    if mode.lifecycle_facts != LEAN_MODES["full"].lifecycle_facts:
        notes.append(f"{mode_name} mode: the lifecycle ran over {mode.lifecycle_facts:,} facts, not 100,000")
    return notes


def write_summary(path: Path, summary: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """``results.json``'s ``lean`` key: the trees, the side-by-side figures and the profiles."""
    payload = json.loads(path.read_text(encoding="utf-8"))
    figures = [row for row in rows if row["target"].startswith("lean_")]
    payload["lean"] = {**summary, "figures": figures}
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
