"""The async face (issue 35): ``memory_context`` in a burst on one event loop, and the LangGraph store.

``async_memory_context_burst``: ``calls`` (200 in full mode) ``memory_context`` calls start at
once on ONE event loop, over ``users`` users of ``facts`` facts each (50 × 40), as a gateway sees a
burst of requests. Two variants, interleaved round by round (who goes first alternates):

- ``async_face``: ``await middleware.amemory_context(...)``, gathered: the reads run on the loop
  with the async driver (aiosqlite, psycopg's async connection), no thread held;
- ``thread_pool``: ``await asyncio.to_thread(middleware.memory_context, ...)``, gathered: what
  gateways (and the LangChain middleware's async hook) did before; the loop's default executor
  (``min(32, CPUs + 4)`` threads) calls the sync path, which waits on its own 4-thread read pool.

A call's latency runs from the burst's start to its answer (every call arrives at that instant);
throughput is calls over the round's wall time (the median of the rounds'); CPU per call is
the process's CPU time (all threads) over the round's calls. Every call must return a ``<memory>`` block (the
middleware turns a failure or a timeout into ``""``, which would look fast): the run checks it, and
raises ``memory_context_timeout_seconds`` to 60 so that a busy machine's slow tail is measured, not
cut to an empty block at the shipped 2 s. The store is migrated and filled (``save``) first; access
tracking is on (the default): each call also counts its facts' accesses in memory.
Each loop closes its pools with ``memstore.aio.aclose()``.

``async_store_{put,get,search}_{seq,c20}`` (``bench_async_store.py``): ``MemstoreStore`` against
LangGraph's ``AsyncSqliteStore`` / ``AsyncPostgresStore``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bench_async_store
from bench_async_store import measured
from bench_core import SQLITE_NORMAL, Result
from bench_data import BENCH_MAX_FACTS, document

from memstore import aio
from memstore.config import MemoryConfig, get_memory_config, set_memory_config
from memstore.gateway.middleware import MemoryMiddleware
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage

SCENARIO_PREFIX = "async_"
CONTEXT = "async_memory_context_burst"
FACE_VARIANTS = ("async_face", "thread_pool")
NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
CALL_TIMEOUT_SECONDS = 60.0
QUERY = "Which database should the billing service use for invoices?"


@dataclass(frozen=True)
class Size:
    users: int
    facts: int
    calls: int
    """Concurrent ``memory_context`` calls per burst."""
    rounds: int
    items: int
    """LangGraph store: items preloaded, spread over ``namespaces``."""
    namespaces: int
    ops: int
    """LangGraph store: operations of each kind timed, per concurrency."""


SIZES = {
    "full": Size(50, 40, 200, 10, 1000, 10, 1000),
    "quick": Size(50, 40, 200, 3, 1000, 10, 300),
    "smoke": Size(5, 40, 20, 1, 50, 5, 20),
}


@dataclass(frozen=True)
class Backend:
    name: str
    url: str
    durability: str


def _config(work: Path, url: str) -> MemoryConfig:
    return MemoryConfig(
        data_dir=str(work),
        max_facts=BENCH_MAX_FACTS,
        database_url=url,
        queue_backend="memory",
        extractor="rules",
        # The shipped 2 s would turn the tail of a burst into empty blocks on a busy machine; the
        # figure is the latency, so no call is cut short (the run checks every block).
        memory_context_timeout_seconds=CALL_TIMEOUT_SECONDS,
    )


def _users(size: Size) -> list[str]:
    return [f"user-{index:03d}" for index in range(size.users)]


def _seed(users: list[str], facts: int) -> None:
    storage = get_memory_storage()
    for user in users:
        if not storage.save(document(facts), user_id=user):
            raise RuntimeError(f"could not store {user}'s {facts} facts")


Call = Callable[[str], Awaitable[str]]


async def _burst(call: Call, users: list[str], calls: int) -> tuple[list[float], float, float]:
    """``calls`` calls started at once: each one's latency from the start, the wall time, and the
    process's CPU seconds (every thread's: the loop's, the pools', aiosqlite's)."""
    start = time.perf_counter()
    cpu = time.process_time()

    async def one(user: str) -> float:
        block = await call(user)
        if "Fact 0:" not in block:
            raise RuntimeError(f"memory_context gave no memory for {user}: it failed (see the log)")
        return (time.perf_counter() - start) * 1000

    # Every call ends before a failure is raised: none is left running when the loop's pools close.
    found = await asyncio.gather(*(one(users[i % len(users)]) for i in range(calls)), return_exceptions=True)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    failed = [outcome for outcome in found if isinstance(outcome, BaseException)]
    if failed:
        raise RuntimeError(f"{len(failed)} of {calls} memory_context calls failed") from failed[0]
    return [outcome for outcome in found if isinstance(outcome, float)], wall, cpu


Rounds = dict[str, tuple[list[float], list[float], list[float]]]


async def _face_rounds(size: Size) -> Rounds:
    """Both variants' latencies, per-round throughputs and CPU ms per call, on this loop; its pools
    closed after."""
    middleware = MemoryMiddleware()
    users = _users(size)

    async def async_face(user: str) -> str:
        return await middleware.amemory_context(user_id=user, query=QUERY)

    async def thread_pool(user: str) -> str:
        return await asyncio.to_thread(middleware.memory_context, user_id=user, query=QUERY)

    variants: dict[str, Call] = {"async_face": async_face, "thread_pool": thread_pool}
    out: Rounds = {name: ([], [], []) for name in variants}
    try:
        for call in variants.values():  # warm-up: pools opened, caches filled
            await _burst(call, users, size.calls)
        for index in range(size.rounds):
            names = list(variants)[index % 2 :] + list(variants)[: index % 2]
            for name in names:
                samples, wall, cpu = await _burst(variants[name], users, size.calls)
                out[name][0].extend(samples)
                out[name][1].append(size.calls / wall)
                out[name][2].append(cpu * 1000 / size.calls)
    finally:
        await aio.aclose()
    return out


def memory_context_burst(work: Path, backends: list[Backend], size: Size) -> list[Result]:
    results: list[Result] = []
    previous = get_memory_config()
    try:
        for backend in backends:
            set_memory_config(_config(work, backend.url))
            reset_memory_storage()
            _seed(_users(size), size.facts)
            for variant, (samples, rates, cpu) in asyncio.run(_face_rounds(size)).items():
                result = measured(CONTEXT, f"{backend.name}_{variant}", backend.durability, samples, rates)
                result.extra["cpu_ms_per_call"] = statistics.median(cpu)
                result.extra["concurrency"] = float(size.calls)
                results.append(result)
    finally:
        set_memory_config(previous)
        reset_memory_storage()
    return results


def async_scenarios(
    work: Path, pg_url: str | None, pg_durability: str, mode_name: str
) -> tuple[list[Result], list[str]]:
    """Both parts on SQLite and, with ``pg_url``, PostgreSQL; returns them and the run's notes."""
    size = SIZES[mode_name]
    sqlite_url = f"sqlite:///{work / 'async.db'}"
    SqlMemoryStorage(sqlite_url)  # migrated before any timing
    backends = [Backend("sqlite", sqlite_url, SQLITE_NORMAL)]
    if pg_url is not None:
        backends.append(Backend("postgresql", pg_url, pg_durability))
    notes = [
        f"async scenarios: memory_context in bursts of {size.calls} concurrent calls over "
        f"{size.users} users × {size.facts} facts, rounds: {size.rounds}; the LangGraph stores on "
        f"{size.items} items in {size.namespaces} namespaces, {size.ops} operations of each kind"
    ]
    results = memory_context_burst(work, backends, size)
    store_results, store_notes = bench_async_store.store_scenarios(
        work,
        [(backend.name, backend.url, backend.durability) for backend in backends],
        size.items,
        size.namespaces,
        size.ops,
        size.rounds,
    )
    return results + store_results, notes + store_notes


def target_fields() -> list[dict[str, Any]]:
    """Informational ratios for ``bench_report``: the async face's throughput over the thread pool's,
    and each store figure of memstore's over LangGraph's."""
    fields: list[dict[str, Any]] = []
    for backend, name in NAMES.items():
        fields.append(
            {
                "key": f"async_face_vs_thread_pool_{backend}",
                "text": f"{name}: burst of memory_context calls, async face vs thread pool (throughput)",
                "subject": (CONTEXT, f"{backend}_async_face"),
                "ref": (CONTEXT, f"{backend}_thread_pool"),
                "limit": None,
                "throughput": True,
            }
        )
    return fields + bench_async_store.target_fields()


def _cell(result: Result | None, stat: str) -> str:
    if result is None:
        return "—"
    value = {"p50": result.median, "p99": result.extra["p99_ms"], **result.extra}
    if stat not in value:
        return "—"
    return f"{value[stat]:,.1f}" if stat == "throughput_per_s" else f"{value[stat]:.2f}"


def async_table(results: list[Result]) -> str:
    """The async scenarios side by side (empty if none ran): p50 and p99 ms, throughput per second."""
    index = {(r.scenario, r.variant): r for r in results if r.scenario.startswith(SCENARIO_PREFIX)}
    if not index:
        return ""
    lines = [
        "| figure | backend | variant | p50 ms | p99 ms | per s | CPU ms per call | throughput vs the last |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    rows = [(CONTEXT, "memory_context burst", FACE_VARIANTS), *bench_async_store.table_rows()]
    for scenario, text, variants in rows:
        for backend, name in NAMES.items():
            found = [index.get((scenario, f"{backend}_{variant}")) for variant in variants]
            reference = found[-1]
            for variant, result in zip(variants, found, strict=True):
                if result is None:
                    continue
                ratio = (
                    f"{result.extra['throughput_per_s'] / reference.extra['throughput_per_s']:.2f}×"
                    if reference is not None
                    else "—"
                )
                lines.append(
                    f"| {text} | {name} | {variant} | {_cell(result, 'p50')} | {_cell(result, 'p99')} "
                    f"| {_cell(result, 'throughput_per_s')} | {_cell(result, 'cpu_ms_per_call')} | {ratio} |"
                )
    return "\n".join(lines)
