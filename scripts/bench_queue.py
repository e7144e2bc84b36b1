"""Extraction throughput through the durable queue: the real updater against a slow local LLM.

For each backend and LLM delay, a run queues a backlog of conversations (one per scope, each scope
holding 20 facts), then starts worker processes (``bench_queue_worker.py``): 1, 4 or 16 threads in
one process, or 2 processes × 8. Throughput is the conversations divided by the time from the
start command to the last row's ``completed_at``. While the workers run, this process keeps
enqueueing probe turns on the request path (``DatabaseUpdateQueue.submit``, debounced far past the
run, so they add no extraction work): their latencies are the scenario's samples. A worker's CPU
per conversation is its process CPU time over the conversations it saved. The in-process
``MemoryUpdateQueue`` (one worker), the design the database queue replaces, runs as a baseline.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from bench_core import Result
from bench_data import document
from bench_queue_worker import bench_config, conversation
from sqlalchemy import delete, func, select

import memstore
from memstore.config import get_memory_config, set_memory_config
from memstore.queue.database import DatabaseUpdateQueue
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.schema.models import queue_table

SCRIPTS = Path(__file__).resolve().parent
SCENARIO_PREFIX = "queue_llm_"
SCENARIO = SCENARIO_PREFIX + "{delay}ms"
SEED_FACTS = 20
PROBE_INTERVAL_SECONDS = 0.025
RUN_TIMEOUT_SECONDS = 300.0
LAYOUTS = {"1w": (1, 1), "4w": (1, 4), "16w": (1, 16), "2x8w": (2, 8)}
"""Variant label: (processes, worker threads per process)."""
MAX_THREADS = max(threads for _, threads in LAYOUTS.values())
BASELINE = "memory_queue_1w"
MEMORY_DURABILITY = "not durable: queued turns live in the process (saves: SQLite as `sqlite`)"


@dataclass(frozen=True)
class QueueMode:
    runs: tuple[tuple[int, int], ...]
    """(LLM delay in ms, conversations per worker thread in one run)."""
    repeats: int


QUEUE_MODES = {
    "full": QueueMode(((1000, 4), (200, 10)), 2),
    "quick": QueueMode(((1000, 2),), 1),
    "smoke": QueueMode(((200, 1),), 1),
}


@dataclass
class _Tally:
    conversations: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0
    saved: int = 0
    enqueue_ms: list[float] = field(default_factory=list)


class _Worker:
    """One ``bench_queue_worker.py`` process, reused across runs."""

    def __init__(self, database_url: str) -> None:
        # The memstore this process imported, ahead of whatever else the path holds.
        paths = [str(Path(memstore.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}
        self._process = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "bench_queue_worker.py"), database_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        if self.read() != "ready":
            raise RuntimeError("benchmark queue worker did not start")

    def send(self, line: str) -> None:
        stdin = self._pipe(self._process.stdin)
        stdin.write(line + "\n")
        stdin.flush()

    def read(self) -> str:
        line = self._pipe(self._process.stdout).readline()
        if not line:
            raise RuntimeError(f"benchmark queue worker exited with code {self._process.wait()}")
        return line.strip()

    def report(self) -> dict[str, Any]:
        payload: dict[str, Any] = json.loads(self.read())
        return payload

    def close(self) -> None:
        try:
            self.send("quit")
            self._process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()

    @staticmethod
    def _pipe(pipe: IO[str] | None) -> IO[str]:
        assert pipe is not None
        return pipe


@contextmanager
def llm_server() -> Iterator[str]:
    """``bench_llm_server.py`` in its own process; yields its root URL."""
    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "bench_llm_server.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        port = process.stdout.readline().split()[-1]
        yield f"http://127.0.0.1:{int(port)}"
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _seed(storage: SqlMemoryStorage, users: list[str]) -> None:
    for user in users:
        assert storage.save(document(SEED_FACTS), user_id=user)


def _probe(queue: DatabaseUpdateQueue, tag: str, stop: threading.Event, samples: list[float]) -> None:
    for index in itertools.count():
        context = conversation(f"probe-{tag}-{index}", index)
        begin = time.perf_counter()
        queue.submit(context)
        samples.append((time.perf_counter() - begin) * 1000)
        if stop.wait(PROBE_INTERVAL_SECONDS):
            return


def _wait_done(database_url: str, prefix: str, count: int) -> datetime:
    """Poll until ``count`` rows of ``prefix`` users are done; the last ``completed_at``."""
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    mine = queue_table.c.user_id.like(f"{prefix}%")
    query = select(queue_table.c.state, func.count(), func.max(queue_table.c.completed_at)).where(mine)
    while True:
        with get_engine(database_url).connect() as conn:
            states = {
                state: (n, last) for state, n, last in conn.execute(query.group_by(queue_table.c.state))
            }
        if "dead" in states:
            raise RuntimeError(f"{states['dead'][0]} benchmark conversation(s) went dead; see the log")
        done, last = states.get("done", (0, None))
        if done >= count and last is not None:
            return last if last.tzinfo else last.replace(tzinfo=UTC)
        if time.monotonic() > deadline:
            raise RuntimeError(f"benchmark queue run {prefix}: {done} of {count} done after the timeout")
        time.sleep(0.05)


def _database_run(
    database_url: str, workers: list[_Worker], layout: tuple[int, int], base_url: str, rounds: int, tag: str
) -> _Tally:
    processes, threads = layout
    count = processes * threads * rounds
    users = [f"{tag}-{index}" for index in range(count)]
    _seed(SqlMemoryStorage(database_url), users)
    queue = DatabaseUpdateQueue(database_url, workers=0)  # the request path: enqueues, runs nothing
    tally = _Tally(conversations=count)
    try:
        for index, user in enumerate(users):
            queue.submit(conversation(user, index), immediately=True)
        stop = threading.Event()
        prober = threading.Thread(target=_probe, args=(queue, tag, stop, tally.enqueue_ms), daemon=True)
        started = datetime.now(UTC)
        for worker in workers[:processes]:
            worker.send(f"db {threads} {base_url}")
        prober.start()
        try:
            finished = _wait_done(database_url, f"{tag}-", count)
        finally:
            stop.set()
            prober.join()
            reports = []
            for worker in workers[:processes]:
                worker.send("stop")
                reports.append(worker.report())
    finally:
        queue.close()
        with get_engine(database_url).begin() as conn:
            conn.execute(delete(queue_table).where(queue_table.c.user_id.like(f"probe-{tag}-%")))
    tally.seconds = (finished - started).total_seconds()
    tally.cpu_s = sum(report["cpu_s"] for report in reports)
    tally.saved = sum(report["updated"] for report in reports)
    if tally.saved < count:
        raise RuntimeError(f"benchmark queue run {tag}: {tally.saved} of {count} conversations saved")
    return tally


def _memory_run(database_url: str, worker: _Worker, base_url: str, rounds: int, tag: str) -> _Tally:
    _seed(SqlMemoryStorage(database_url), [f"{tag}-{index}" for index in range(rounds)])
    worker.send(f"memory {rounds} {base_url} {tag}")
    report = worker.report()
    if not report["drained"] or report["updated"] < rounds:
        raise RuntimeError(f"memory queue baseline {tag}: {report['updated']} of {rounds} saved")
    return _Tally(rounds, report["seconds"], report["cpu_s"], report["updated"], report["enqueue_ms"])


def _result(scenario: str, variant: str, durability: str, tally: _Tally, layout: tuple[int, int]) -> Result:
    return Result(
        scenario,
        variant,
        durability,
        tally.enqueue_ms,
        {
            "throughput_per_s": tally.conversations / tally.seconds,
            "processes": layout[0],
            "workers": layout[0] * layout[1],
            "conversations": tally.conversations,
            "cpu_ms_per_conversation": 1000 * tally.cpu_s / tally.saved,
        },
    )


def queue_throughput(targets: dict[str, tuple[str, str]], mode_name: str) -> list[Result]:
    """``targets`` maps a backend to (migrated database URL, durability); SQLite also runs the baseline."""
    mode = QUEUE_MODES[mode_name]
    previous = get_memory_config()
    results: list[Result] = []
    try:
        with llm_server() as server:
            for backend, (url, durability) in targets.items():
                set_memory_config(bench_config(url))
                with ExitStack() as stack:
                    workers = [_Worker(url) for _ in range(2)]
                    for worker in workers:
                        stack.callback(worker.close)
                    for delay, rounds in mode.runs:
                        base_url = f"{server}/d{delay}/v1"
                        # Discarded: fills both workers' updater pools and warms every lazy import.
                        _database_run(url, workers, (2, MAX_THREADS), base_url, 1, f"warm-{backend}-{delay}")
                        names = [*LAYOUTS, *([BASELINE] if backend == "sqlite" else [])]
                        tallies = {name: _Tally() for name in names}
                        for repeat in range(mode.repeats):
                            shift = repeat % len(names)
                            for name in names[shift:] + names[:shift]:
                                tag = f"{backend}-{delay}-{name}-{repeat}"
                                if name == BASELINE:
                                    run = _memory_run(url, workers[0], base_url, rounds, tag)
                                else:
                                    run = _database_run(url, workers, LAYOUTS[name], base_url, rounds, tag)
                                _add(tallies[name], run)
                        scenario = SCENARIO.format(delay=delay)
                        for name, tally in tallies.items():
                            layout = LAYOUTS.get(name, (1, 1))
                            durable = MEMORY_DURABILITY if name == BASELINE else durability
                            variant = name if name == BASELINE else f"{backend}_{name}"
                            results.append(_result(scenario, variant, durable, tally, layout))
                        print(f"  queue: {backend} at {delay} ms done", flush=True)
    finally:
        set_memory_config(previous)
    return _with_scaling(results)


def _add(total: _Tally, run: _Tally) -> None:
    total.conversations += run.conversations
    total.seconds += run.seconds
    total.cpu_s += run.cpu_s
    total.saved += run.saved
    total.enqueue_ms += run.enqueue_ms


def _with_scaling(results: list[Result]) -> list[Result]:
    """Each variant's throughput over (its workers × the one-worker throughput): 1.0 is linear."""
    single = {
        (r.scenario, r.variant.rsplit("_", 1)[0]): r.extra["throughput_per_s"]
        for r in results
        if r.variant.endswith("_1w") and not r.variant.startswith("memory_queue")
    }
    for r in results:
        one = single.get((r.scenario, r.variant.rsplit("_", 1)[0]))
        if one and not r.variant.startswith("memory_queue"):
            r.extra["scaling_vs_linear"] = r.extra["throughput_per_s"] / (r.extra["workers"] * one)
    return results
