"""Throughput of N processes saving to distinct scopes, against one process doing the same."""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from bench_core import Result
from bench_data import document, fact, use_bench_config

from memstore.storage.sql import SqlMemoryStorage

SCOPE_FACTS = 20
WORKERS = 4


def worker(url: str, data_dir: str, user: str, saves: int, barrier: Barrier, results: Any) -> None:
    """Each save follows the updater's cycle (load, change one fact, save), adding and removing in turn."""
    use_bench_config(Path(data_dir))
    storage = SqlMemoryStorage(url)
    assert storage.save(document(SCOPE_FACTS), user_id=user)
    latencies: list[float] = []
    barrier.wait()
    start = time.perf_counter()
    for index in range(saves):
        memory = storage.load(user_id=user)
        if index % 2 == 0:
            memory["facts"].append(fact(10_000 + index))
        else:
            memory["facts"].pop()
        begin = time.perf_counter()
        assert storage.save(memory, user_id=user)
        latencies.append((time.perf_counter() - begin) * 1000)
    results.put((start, time.perf_counter(), latencies))


def _run(url: str, data_dir: Path, processes: int, saves: int, tag: str) -> tuple[float, list[float]]:
    """Seconds from the first worker's start to the last one's end, and every save's latency."""
    # Forked after the parent prepared the database: workers skip imports and the schema check,
    # and build their own engine (engines are per process), like separate gateway processes.
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(processes)
    results = context.Queue()
    workers = [
        context.Process(target=worker, args=(url, str(data_dir), f"{tag}-{n}", saves, barrier, results))
        for n in range(processes)
    ]
    for process in workers:
        process.start()
    outcomes = [results.get(timeout=600) for _ in workers]
    for process in workers:
        process.join()
        if process.exitcode != 0:
            raise RuntimeError(f"benchmark worker failed with exit code {process.exitcode}")
    elapsed = max(end for _, end, _ in outcomes) - min(start for start, _, _ in outcomes)
    return elapsed, [latency for _, _, latencies in outcomes for latency in latencies]


def concurrent_saves(
    targets: dict[str, tuple[str, str]], data_dir: Path, saves: int, rounds: int
) -> list[Result]:
    """``targets`` maps a backend to (database URL, durability). One and N processes alternate for
    ``rounds`` rounds, so drift on a shared machine hits both; throughput is total saves / total time.
    """
    results: list[Result] = []
    for backend, (url, durability) in targets.items():
        SqlMemoryStorage(url)  # migrate/check once, before the fork
        seconds = {1: 0.0, WORKERS: 0.0}
        latencies: dict[int, list[float]] = {1: [], WORKERS: []}
        for round_ in range(rounds):
            for processes in (1, WORKERS) if round_ % 2 == 0 else (WORKERS, 1):
                elapsed, observed = _run(url, data_dir, processes, saves, f"{backend}-{processes}p-{round_}")
                seconds[processes] += elapsed
                latencies[processes] += observed
        for processes, total in seconds.items():
            throughput = processes * saves * rounds / total
            results.append(
                Result(
                    "concurrent_saves",
                    f"{backend}_{processes}proc",
                    durability,
                    latencies[processes],
                    {"throughput_per_s": throughput, "processes": processes},
                )
            )
    return results
