"""The lean scenario's two trees, and its command-line figures: start-up and the lifecycle dry run.

A ``Tree`` is one memstore source tree (the exported baseline or the checkout) with its own
scratch directory and PostgreSQL database; ``child`` runs a ``bench_lean_child.py`` task and
``run_cli`` runs ``memstore`` itself in a fresh interpreter whose ``PYTHONPATH`` is that tree.
The lifecycle database is built once through ``save`` and copied when both trees ship the same
migrations. The profiles of the command line (``-X importtime`` and cProfile of a whole run,
imports included) live here too.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench_core import SQLITE_NORMAL, Result
from bench_data import STAMP, document

SCRIPTS = Path(__file__).resolve().parent
CHILD = SCRIPTS / "bench_lean_child.py"
TREES = ("baseline", "current")
LIFECYCLE_FACTS_PER_SCOPE = 100
CHILD_TIMEOUT_SECONDS = 900.0
CLI = "import sys; from memstore.cli import main; sys.argv[0] = 'memstore'; sys.exit(main())"
LIFECYCLE_ARGV = ("lifecycle", "run", "--dry-run", "--below", "0.5")
PROFILE_LINES = 20
IMPORT_LINES = 12
PROFILED_CLI = """
import cProfile, pstats, sys
lines = int(sys.argv.pop(1))
sys.argv[0] = "memstore"
profiler = cProfile.Profile()
profiler.enable()
try:
    from memstore.cli import main
    main()
except SystemExit as exc:
    if exc.code:
        raise
finally:
    profiler.disable()
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(lines)
"""


def say(message: str) -> None:
    """Progress on stdout, with the clock time: a full run takes minutes."""
    print(f"  lean: {message} ({time.strftime('%H:%M:%S')})", flush=True)


@dataclass(frozen=True)
class Tree:
    name: str
    root: Path
    work: Path
    pg_url: str | None

    def env(self) -> dict[str, str]:
        """The parent's environment minus every memstore setting, with this tree first on the path."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("MEMSTORE_")}
        return env | {"PYTHONPATH": str(self.root)}

    @property
    def sqlite_url(self) -> str:
        return f"sqlite:///{self.work / 'lean.db'}"

    @property
    def lifecycle_url(self) -> str:
        return f"sqlite:///{self.work / 'lifecycle.db'}"


def order(round_index: int) -> tuple[str, ...]:
    """Baseline first in even rounds, current first in odd ones: ABBA, so drift hits both alike."""
    return TREES if round_index % 2 == 0 else TREES[::-1]


def child(tree: Tree, task: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one ``bench_lean_child.py`` task with ``tree``'s memstore (and ``env``); its JSON answer."""
    done = subprocess.run(
        [sys.executable, str(CHILD)],
        input=json.dumps({"work": str(tree.work), **task}),
        capture_output=True,
        text=True,
        env=tree.env() | (env or {}),
        cwd=tree.work,
        timeout=CHILD_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"lean {task['task']} on the {tree.name} tree failed:\n{done.stderr[-3000:]}")
    answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return answer


def same_schema(first: Path, second: Path) -> bool:
    """Whether both trees ship the same migration scripts, hence the same schema at head."""
    versions = [root / "alembic" / "versions" for root in (first, second)]
    names = [sorted(path.name for path in folder.glob("*.py")) for folder in versions]
    if names[0] != names[1]:
        return False
    _, mismatch, errors = filecmp.cmpfiles(versions[0], versions[1], names[0], shallow=False)
    return not mismatch and not errors


# -- the command line: start-up and the lifecycle dry run --------------------------------------


def run_cli(tree: Tree, argv: tuple[str, ...], env: dict[str, str] | None = None) -> tuple[float, int]:
    """``memstore ARGV`` in a fresh interpreter with ``tree``'s memstore: its wall ms and output bytes."""
    out = tree.work / "cli-output.txt"
    with out.open("wb") as stdout:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", CLI, *argv],
            stdout=stdout,
            stderr=subprocess.PIPE,
            env=tree.env() | (env or {}),
            cwd=tree.work,
            timeout=CHILD_TIMEOUT_SECONDS,
            check=False,
        )
        elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(
            f"memstore {' '.join(argv)} on the {tree.name} tree exited {done.returncode}:\n"
            f"{done.stderr.decode(errors='replace')[-3000:]}"
        )
    return elapsed, out.stat().st_size


def cli_figures(trees: dict[str, Tree], rounds: int) -> list[Result]:
    """``memstore --version`` and ``--help``, each tree in turn (ABBA), after a discarded start."""
    samples: dict[tuple[str, str], list[float]] = {}
    for tree in trees.values():  # discarded: the first start reads the files from disk
        run_cli(tree, ("--version",))
    for round_index in range(rounds):
        for command in ("version", "help"):
            for name in order(round_index):
                elapsed, _ = run_cli(trees[name], (f"--{command}",))
                samples.setdefault((command, name), []).append(elapsed)
    say("CLI start-up done")
    return [
        Result(f"lean_cli_{command}", name, "n/a (start-up)", values)
        for (command, name), values in samples.items()
    ]


def lifecycle_doc(now: datetime) -> dict[str, Any]:
    """100 facts created over the last 200 days (half-life 90 days): about 60 % decay under 0.5."""
    memory = document(LIFECYCLE_FACTS_PER_SCOPE)
    for index, item in enumerate(memory["facts"]):
        item["createdAt"] = (now - timedelta(days=2 * index)).strftime("%Y-%m-%dT%H:%M:%SZ")
    memory["lastUpdated"] = STAMP
    return memory


def build_lifecycle(trees: dict[str, Tree], facts: int) -> dict[str, float]:
    """One database per tree: built once by the current tree and copied when both trees ship the
    same migrations (the same schema at head), else built by each tree with its own code."""
    doc = lifecycle_doc(datetime.now(UTC))
    scopes = facts // LIFECYCLE_FACTS_PER_SCOPE
    shared = same_schema(trees["baseline"].root, trees["current"].root)
    seconds: dict[str, float] = {}
    for name in ("current", "baseline"):
        tree = trees[name]
        if name == "baseline" and shared:
            _copy_sqlite(trees["current"].work / "lifecycle.db", tree.work / "lifecycle.db")
            continue
        task = {"task": "build", "url": tree.lifecycle_url, "scopes": scopes, "doc": doc}
        seconds[name] = child(tree, task)["seconds"]
    how = "built once (same migrations in both trees)" if shared else "built by each tree"
    say(f"lifecycle database of {facts:,} facts {how}")
    return seconds


def _copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy through SQLite's backup API: the WAL's commits included."""
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
        dst.execute("PRAGMA journal_mode = WAL")  # as memstore keeps its files


def lifecycle_figures(trees: dict[str, Tree], facts: int) -> list[Result]:
    """``memstore lifecycle run --dry-run --below 0.5`` over ``facts``, then with ``--json``."""
    build_seconds = build_lifecycle(trees, facts)
    variants = {
        "lean_lifecycle_dry_run": LIFECYCLE_ARGV,
        "lean_lifecycle_dry_run_json": (*LIFECYCLE_ARGV, "--json"),
    }
    samples: dict[tuple[str, str], list[float]] = {}
    output: dict[tuple[str, str], float] = {}
    for index, (scenario, argv) in enumerate(variants.items()):
        for name in order(index):  # text: baseline first; JSON: current first
            tree = trees[name]
            elapsed, size = run_cli(tree, argv, {"MEMSTORE_DATABASE_URL": tree.lifecycle_url})
            samples.setdefault((scenario, name), []).append(elapsed)
            output[(scenario, name)] = size
    say("lifecycle done")
    results = []
    for (scenario, name), values in samples.items():
        extra = {"facts": float(facts), "output_bytes": output[(scenario, name)]}
        if name in build_seconds:
            extra["build_s"] = build_seconds[name]
        results.append(Result(scenario, name, SQLITE_NORMAL, values, extra))
    return results


def importtime(tree: Tree, argv: tuple[str, ...]) -> str:
    """``python -X importtime`` of ``memstore ARGV``: the imports that cost most, cumulatively, and
    the heaviest top-level packages (a command that imports one it does not use shows here)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", CLI, *argv],
        capture_output=True,
        text=True,
        env=tree.env(),
        cwd=tree.work,
        timeout=CHILD_TIMEOUT_SECONDS,
        check=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            rows.append((int(parts[1]), int(parts[0]), parts[2].rstrip()))
    rows.sort(reverse=True)
    packages: dict[str, int] = {}
    for total, _, name in rows:
        packages.setdefault(name.strip().split(".")[0], total)
    lines = [f"{'cumulative ms':>13} {'self ms':>8}  module (python -X importtime)"]
    lines += [f"{total / 1000:13.1f} {own / 1000:8.1f}  {name}" for total, own, name in rows[:IMPORT_LINES]]
    heaviest = sorted(packages.items(), key=lambda item: -item[1])[:IMPORT_LINES]
    lines += ["", "heaviest top-level packages (cumulative ms): "]
    lines += [", ".join(f"{name} {total / 1000:.0f}" for name, total in heaviest)]
    return "\n".join(lines)


def cli_profile(tree: Tree, argv: tuple[str, ...]) -> str:
    """cProfile of ``memstore ARGV`` in a fresh interpreter, imports included (a CLI pays them)."""
    done = subprocess.run(
        [sys.executable, "-c", PROFILED_CLI, str(PROFILE_LINES), *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=tree.env() | {"MEMSTORE_DATABASE_URL": tree.lifecycle_url},
        cwd=tree.work,
        timeout=CHILD_TIMEOUT_SECONDS,
        check=True,
    )
    return done.stderr


def cli_profiles(kinds: list[str], tree: Tree) -> dict[str, str]:
    """Start-up (``cli_version``, ``cli_help``): ``-X importtime``; the lifecycle (``lifecycle``,
    ``lifecycle_json``): cProfile of the whole command."""
    found = {}
    for kind in kinds:
        if kind.startswith("cli_"):
            found[kind] = importtime(tree, (f"--{kind.removeprefix('cli_')}",))
        else:
            argv = (*LIFECYCLE_ARGV, *(("--json",) if kind.endswith("_json") else ()))
            found[kind] = trim_profile(cli_profile(tree, argv), tree.root)
    return found


def trim_profile(text: str, root: Path) -> str:
    """pstats' table without its preamble, paths shortened (the tree's and site-packages' prefixes)."""
    lines = text.splitlines()
    start = next((index for index, line in enumerate(lines) if "ncalls" in line), 0)
    body = "\n".join(line.rstrip() for line in lines[start:] if line.strip())
    body = body.replace(f"{root}/", "").replace(f"{SCRIPTS}/", "")
    return re.sub(r"\S*/(site-packages|lib/python3\.\d+)/", "", body)
