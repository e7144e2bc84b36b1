"""memstore's LangGraph store against LangGraph's own async stores, on one event loop per dialect.

``MemstoreStore`` (``memstore.integrations.langgraph_store``, ``namespace_user_index=1``: namespaces
``("memories", <user>)``, so each namespace is a memstore user) against ``AsyncSqliteStore``
(``langgraph-checkpoint-sqlite``; its one aiosqlite connection set to WAL + ``synchronous=NORMAL``
by the benchmark, memstore's SQLite durability) and ``AsyncPostgresStore``
(``langgraph-checkpoint-postgres``, a ``PoolConfig`` of 5 to 15 connections, as many as memstore's
pool holds), in the run's PostgreSQL database. Both stores start with ``items`` items in
``namespaces`` namespaces (small JSON values: a sentence, a ``kind`` among 4, a number), then time
``ops`` operations of each kind, one after another (``seq``) and 20 at a time (``c20``: 20 tasks
on the loop, each starting its next operation when the last answers):

- ``put``: overwrite an existing item with a new value (memstore also keeps the item's history);
- ``get``: one item by namespace and key;
- ``search``: one namespace, ``filter={"kind": ...}`` (a quarter of its items match), limit 10,
  no query (neither store has embeddings configured), newest first.

Each batch of operations is split into rounds, both stores alternating who goes first. A sample is
one awaited call; throughput is operations over the round's wall time (the median of the rounds'),
CPU per call the process's CPU time (all threads) over the round's operations.

LangGraph's async stores are ``AsyncBatchedBaseStore``s: operations awaited concurrently on the
loop are gathered by a background task into one ``abatch`` (one query for many gets). The ``c20``
figures show what that buys; ``MemstoreStore`` runs each awaited call as its own batch.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from bench_core import Result
from langgraph.store.base import BaseStore, PutOp
from sqlalchemy.engine import make_url

from memstore import aio
from memstore.config import MemoryConfig

OPS = ("put", "get", "search")
CONCURRENCY = {"seq": 1, "c20": 20}
IMPLS = ("memstore", "langgraph")
NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
KINDS = ("preference", "fact", "goal", "constraint")
LANGGRAPH_SQLITE = "crash-safe, not power-loss-safe (WAL, synchronous=NORMAL, set by the benchmark)"
PG_POOL_MIN, PG_POOL_MAX = 5, 15
PRELOAD_CHUNK = 500

Op = Callable[[int], Awaitable[None]]


def scenario(op: str, mode: str) -> str:
    return f"async_store_{op}_{mode}"


def _value(index: int, version: int) -> dict[str, Any]:
    return {
        "text": f"Memory {index}: prefers PostgreSQL for billing and short answers (v{version})",
        "kind": KINDS[index % len(KINDS)],
        "n": index,
        "version": version,
    }


class Work:
    """Where item ``i`` lives, and the operations on one store."""

    def __init__(self, items: int, namespaces: int) -> None:
        self.items = items
        self.namespaces = [("memories", f"user-{index:03d}") for index in range(namespaces)]
        self.version = 1

    def where(self, index: int) -> tuple[tuple[str, str], str]:
        index %= self.items
        return self.namespaces[index % len(self.namespaces)], f"item-{index:05d}"

    async def preload(self, store: BaseStore) -> None:
        for first in range(0, self.items, PRELOAD_CHUNK):
            last = min(first + PRELOAD_CHUNK, self.items)
            await store.abatch([PutOp(*self.where(i), _value(i, 0)) for i in range(first, last)])

    def operations(self, store: BaseStore) -> dict[str, Op]:
        async def put(index: int) -> None:
            namespace, key = self.where(index)
            await store.aput(namespace, key, _value(index, self.version))

        async def get(index: int) -> None:
            namespace, key = self.where(index)
            if await store.aget(namespace, key) is None:
                raise RuntimeError(f"{type(store).__name__}: {namespace}/{key} is missing")

        async def search(index: int) -> None:
            namespace = self.namespaces[index % len(self.namespaces)]
            found = await store.asearch(namespace, filter={"kind": KINDS[index % len(KINDS)]}, limit=10)
            if not found or any(item.value["kind"] != KINDS[index % len(KINDS)] for item in found):
                raise RuntimeError(f"{type(store).__name__}: the filtered search of {namespace} is wrong")

        return {"put": put, "get": get, "search": search}


async def _run(op: Op, indices: list[int], concurrency: int) -> tuple[list[float], float, float]:
    """``indices`` through ``op`` by ``concurrency`` tasks: each call's ms, the wall time and the
    process's CPU seconds (all threads)."""
    samples: list[float] = []
    pending = iter(indices)

    async def worker() -> None:
        for index in pending:
            start = time.perf_counter()
            await op(index)
            samples.append((time.perf_counter() - start) * 1000)

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, time.perf_counter() - start, time.process_time() - cpu


@asynccontextmanager
async def _langgraph(backend: str, url: str, work: Path) -> AsyncIterator[BaseStore]:
    if backend == "sqlite":
        from langgraph.store.sqlite.aio import AsyncSqliteStore

        async with AsyncSqliteStore.from_conn_string(str(work / "langgraph-async.db")) as lite:
            await lite.conn.execute("PRAGMA journal_mode = WAL")
            await lite.conn.execute("PRAGMA synchronous = NORMAL")
            await lite.setup()
            yield lite
        return
    from langgraph.store.postgres.aio import AsyncPostgresStore
    from langgraph.store.postgres.base import PoolConfig

    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    async with AsyncPostgresStore.from_conn_string(
        conninfo, pool_config=PoolConfig(min_size=PG_POOL_MIN, max_size=PG_POOL_MAX)
    ) as pg:
        await pg.setup()
        yield pg


Samples = dict[tuple[str, str, str], tuple[list[float], list[float], list[float]]]


async def _dialect(
    backend: str, url: str, work: Path, items: int, namespaces: int, ops: int, rounds: int
) -> Samples:
    """Every (op, mode, store) of one dialect on this loop: latencies, per-round throughputs and
    CPU ms per operation."""
    from memstore.integrations.langgraph_store import MemstoreStore

    config = MemoryConfig(data_dir=str(work), database_url=url, queue_backend="memory", extractor="rules")
    shape = Work(items, namespaces)
    out: Samples = {}
    try:
        async with AsyncExitStack() as stack:
            stores: dict[str, BaseStore] = {
                "memstore": MemstoreStore(namespace_user_index=1, config=config),
                "langgraph": await stack.enter_async_context(_langgraph(backend, url, work)),
            }
            operations = {}
            for impl, store in stores.items():
                await shape.preload(store)
                operations[impl] = shape.operations(store)
                for op in OPS:  # warm-up: connections opened, statements prepared
                    await _run(operations[impl][op], list(range(min(20, ops))), 1)
            rng = random.Random(35)
            for op in OPS:
                for mode, concurrency in CONCURRENCY.items():
                    for round_index in range(rounds):
                        shape.version += 1
                        indices = [rng.randrange(items) for _ in range(max(1, ops // rounds))]
                        order = IMPLS[round_index % 2 :] + IMPLS[: round_index % 2]
                        for impl in order:
                            samples, wall, cpu = await _run(operations[impl][op], indices, concurrency)
                            found = out.setdefault((op, mode, impl), ([], [], []))
                            found[0].extend(samples)
                            found[1].append(len(indices) / wall)
                            found[2].append(cpu * 1000 / len(indices))
    finally:
        await aio.aclose()
    return out


def p99(samples: list[float]) -> float:
    """Nearest-rank p99, as ``Result.p95``."""
    ordered = sorted(samples)
    return ordered[max(0, -(-99 * len(ordered) // 100) - 1)]


def measured(
    scenario: str, variant: str, durability: str, samples: list[float], rates: list[float]
) -> Result:
    """A result with its p99 and its throughput (the median of the rounds')."""
    extra = {"p99_ms": p99(samples), "throughput_per_s": statistics.median(rates), "rounds": len(rates)}
    return Result(scenario, variant, durability, samples, extra)


def store_scenarios(
    work: Path, backends: list[tuple[str, str, str]], items: int, namespaces: int, ops: int, rounds: int
) -> tuple[list[Result], list[str]]:
    """Both stores on each backend ``(name, url, durability)``; returns the results and notes."""
    results: list[Result] = []
    for backend, url, durability in backends:
        samples = asyncio.run(_dialect(backend, url, work, items, namespaces, ops, min(rounds, ops)))
        for (op, mode, impl), (latencies, rates, cpu) in samples.items():
            theirs = LANGGRAPH_SQLITE if impl == "langgraph" and backend == "sqlite" else durability
            result = measured(scenario(op, mode), f"{backend}_{impl}", theirs, latencies, rates)
            result.extra["cpu_ms_per_call"] = statistics.median(cpu)
            result.extra["concurrency"] = float(CONCURRENCY[mode])
            results.append(result)
    notes = ["LangGraph store scenarios: AsyncSqliteStore on its one aiosqlite connection, as it is built"]
    if any(backend == "postgresql" for backend, _url, _durability in backends):
        notes.append(
            f"LangGraph store scenarios: AsyncPostgresStore with a pool of {PG_POOL_MIN} to "
            f"{PG_POOL_MAX} connections (as many as memstore's pool holds)"
        )
    return results, notes


def table_rows() -> list[tuple[str, str, tuple[str, ...]]]:
    """For ``bench_async.async_table``: (scenario, label, variants, the reference last)."""
    labels = {"seq": "one at a time", "c20": "20 at a time"}
    return [(scenario(op, mode), f"store {op}, {labels[mode]}", IMPLS) for op in OPS for mode in CONCURRENCY]


def target_fields() -> list[dict[str, Any]]:
    """Informational ratios: memstore's store over LangGraph's (median latency), per figure."""
    fields: list[dict[str, Any]] = []
    for backend, name in NAMES.items():
        for op in OPS:
            for mode in CONCURRENCY:
                fields.append(
                    {
                        "key": f"store_{op}_{mode}_{backend}_vs_langgraph",
                        "text": f"{name}: store {op} ({mode}), MemstoreStore vs LangGraph's (median)",
                        "subject": (scenario(op, mode), f"{backend}_memstore"),
                        "ref": (scenario(op, mode), f"{backend}_langgraph"),
                        "limit": None,
                    }
                )
    return fields
