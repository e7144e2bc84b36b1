"""Single-process scenarios: every variant of a scenario runs interleaved with the others in one loop."""

from __future__ import annotations

import functools
import itertools
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench_floors
import bench_pg
from bench_core import FILE_FSYNC, SQLITE_FULL, SQLITE_NORMAL, Result, Sampler, interleave, timed
from bench_data import bulk_sqlite, document, fact, file_storage, random_users
from langgraph.store.sqlite import SqliteStore
from sqlalchemy import event

from memstore.config import get_memory_config, set_memory_config
from memstore.inject.render import format_memory_for_injection, render_memory
from memstore.inject.tokens import count_tokens
from memstore.storage.base import MemoryStorage
from memstore.storage.file import FileMemoryStorage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine

LOAD_FACTS = 100
SAVE_SIZES = (10, 100, 500)
INJECT_FACTS = 500
INJECT_TOKENS = 2000
ACCESS_SCENARIO = "load_inject_100_access"
ACCESS_TOKENS = 8000
"""Budget (and guaranteed budget) of the access scenario: all 100 facts fit, and each is recorded."""
LANGGRAPH_DURABILITY = "crash-safe, not power-loss-safe (WAL, synchronous=NORMAL, set by the benchmark)"
_NAMESPACE = ("memory", "bench")


@dataclass
class Stores:
    """Every variant's backing store, each in its own file under the work directory."""

    sql: SqlMemoryStorage
    sql_full: SqlMemoryStorage
    file: FileMemoryStorage
    raw: sqlite3.Connection
    langgraph: SqliteStore
    pg: SqlMemoryStorage | None = None
    pg_conn: Any = None
    pg_durability: str = ""
    providers: dict[str, tuple[MemoryStorage, str]] = field(default_factory=dict)


def _synchronous_full(path: Path) -> SqlMemoryStorage:
    """memstore on SQLite with synchronous=FULL: the like-for-like durability match for the file store."""
    url = f"sqlite:///{path}"

    def on_connect(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        dbapi_connection.execute("PRAGMA synchronous = FULL")

    # Registered after memstore's own listener, so it runs second and wins.
    event.listen(get_engine(url), "connect", on_connect)
    storage = SqlMemoryStorage(url)
    with get_engine(url).connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2, "synchronous=FULL did not stick"
    return storage


def open_stores(work: Path, pg_url: str | None) -> Stores:
    sql = SqlMemoryStorage(f"sqlite:///{work / 'memstore.db'}")
    lg_conn = bench_floors.sqlite_connect(str(work / "langgraph.db"))
    langgraph = SqliteStore(lg_conn)
    langgraph.setup()
    stores = Stores(
        sql=sql,
        sql_full=_synchronous_full(work / "memstore-full.db"),
        file=file_storage(work / "files"),
        raw=bench_floors.sqlite_connect(str(work / "memstore.db")),
        langgraph=langgraph,
    )
    stores.providers = {
        "sqlite": (stores.sql, SQLITE_NORMAL),
        "sqlite_sync_full": (stores.sql_full, SQLITE_FULL),
        "file": (stores.file, FILE_FSYNC),
    }
    if pg_url is not None:
        stores.pg = SqlMemoryStorage(pg_url)
        stores.pg_conn = bench_pg.connect(pg_url)
        stores.pg_durability = bench_pg.durability(stores.pg_conn)
        stores.providers["postgresql"] = (stores.pg, stores.pg_durability)
    return stores


def _results(
    scenario: str,
    samples: dict[str, list[float]],
    durability: dict[str, str],
    extra: dict[str, dict[str, float]] | None = None,
) -> list[Result]:
    return [
        Result(scenario, name, durability[name], values, (extra or {}).get(name, {}))
        for name, values in samples.items()
    ]


def load_warm(stores: Stores, iterations: int, warmup: int) -> list[Result]:
    user = "bench-load"
    variants: dict[str, Sampler] = {}
    durability: dict[str, str] = {}
    for name, (storage, durable) in stores.providers.items():
        if name == "sqlite_sync_full":
            continue  # reads do not depend on the commit mode
        assert storage.save(document(LOAD_FACTS), user_id=user)
        storage.load(user_id=user)
        variants[name] = timed(functools.partial(storage.load, user_id=user))
        durability[name] = durable
    return _results("load_warm_100", interleave(variants, iterations, warmup), durability)


def load_cold(stores: Stores, iterations: int, warmup: int) -> list[Result]:
    """``reload()`` bypasses the provider cache: the cost of a fresh process's first load."""
    user = "bench-load"
    stores.langgraph.put(_NAMESPACE, user, document(LOAD_FACTS))
    expected = stores.sql.reload(user_id=user)
    assert bench_floors.sqlite_load(stores.raw, user) == expected, "the sqlite3 floor built another dict"
    variants: dict[str, Sampler] = {
        "sqlite": timed(lambda: stores.sql.reload(user_id=user)),
        "sqlite3_floor": timed(lambda: bench_floors.sqlite_load(stores.raw, user)),
        "langgraph_sqlite": timed(lambda: stores.langgraph.get(_NAMESPACE, user)),
        "file": timed(lambda: stores.file.reload(user_id=user)),
    }
    durability = {
        "sqlite": SQLITE_NORMAL,
        "sqlite3_floor": SQLITE_NORMAL,
        "langgraph_sqlite": LANGGRAPH_DURABILITY,
        "file": FILE_FSYNC,
    }
    if stores.pg is not None:
        pg, conn = stores.pg, stores.pg_conn
        assert bench_floors.psycopg_load(conn, user) == pg.reload(user_id=user), "psycopg floor differs"
        variants["postgresql"] = timed(lambda: pg.reload(user_id=user))
        variants["psycopg_floor"] = timed(lambda: bench_floors.psycopg_load(conn, user))
        variants["psycopg_select1"] = timed(lambda: conn.execute("SELECT 1").fetchone())
        for name in ("postgresql", "psycopg_floor", "psycopg_select1"):
            durability[name] = stores.pg_durability
    return _results("load_cold_100", interleave(variants, iterations, warmup), durability)


def _save_sampler(load: Callable[[], dict[str, Any]], save: Callable[[dict[str, Any]], object]) -> Sampler:
    """Time a save that adds one fact; then (untimed) remove it again so the scope keeps its size."""
    serial = itertools.count(1_000_000)

    def sample() -> float:
        memory = load()
        added = fact(next(serial))
        memory["facts"].append(added)
        start = time.perf_counter()
        assert save(memory)
        elapsed = (time.perf_counter() - start) * 1000
        memory = load()
        memory["facts"] = [item for item in memory["facts"] if item["id"] != added["id"]]
        assert save(memory)
        return elapsed

    return sample


@dataclass
class _LangGraphDocument:
    """The whole document as one LangGraph store value."""

    store: SqliteStore
    key: str

    def load(self) -> dict[str, Any]:
        item = self.store.get(_NAMESPACE, self.key)
        assert item is not None
        return item.value

    def save(self, memory: dict[str, Any]) -> bool:
        self.store.put(_NAMESPACE, self.key, memory)
        return True


def save_add_one(stores: Stores, iterations: int, warmup: int) -> list[Result]:
    results: list[Result] = []
    for size in SAVE_SIZES:
        user = f"bench-save-{size}"
        variants: dict[str, Sampler] = {}
        durability: dict[str, str] = {}
        for name, (storage, durable) in stores.providers.items():
            assert storage.save(document(size), user_id=user)
            variants[name] = _save_sampler(
                functools.partial(storage.load, user_id=user), functools.partial(storage.save, user_id=user)
            )
            durability[name] = durable
        langgraph = _LangGraphDocument(stores.langgraph, user)
        langgraph.save(document(size))
        variants["langgraph_sqlite"] = _save_sampler(langgraph.load, langgraph.save)
        durability["langgraph_sqlite"] = LANGGRAPH_DURABILITY
        results += _results(f"save_add1_{size}", interleave(variants, iterations, warmup), durability)
    return results


def inject(iterations: int, warmup: int) -> list[Result]:
    """Steady state (token counts cached, as on every request after the first) and the uncached worst case."""
    memory = document(INJECT_FACTS)
    text = format_memory_for_injection(memory, INJECT_TOKENS)
    assert text and count_tokens(text, use_tiktoken=True) <= INJECT_TOKENS + 500
    serial = itertools.count()

    def uncached() -> float:
        tag = next(serial)
        facts = [{**item, "content": f"{tag} {item['content']}"} for item in memory["facts"]]
        fresh = {**memory, "facts": facts}
        start = time.perf_counter()
        format_memory_for_injection(fresh, INJECT_TOKENS)
        return (time.perf_counter() - start) * 1000

    variants: dict[str, Sampler] = {
        "tiktoken": timed(lambda: format_memory_for_injection(memory, INJECT_TOKENS)),
        "tiktoken_uncached": uncached,
        "char_estimate": timed(
            functools.partial(format_memory_for_injection, memory, INJECT_TOKENS, use_tiktoken=False)
        ),
    }
    durability = dict.fromkeys(variants, "n/a (pure computation)")
    return _results("inject_500", interleave(variants, iterations, warmup), durability)


def _random_reloads(storage: SqlMemoryStorage, users: list[str]) -> Sampler:
    cycle = itertools.cycle(users)
    return timed(lambda: storage.reload(user_id=next(cycle)))


def scale(work: Path, scopes: int, facts: int, iterations: int, warmup: int) -> list[Result]:
    """Cold loads of random scopes: a 100-scope file against a ``scopes``-scope file, same row shape."""
    started = time.perf_counter()
    files = {"100_scopes": 100, "many_scopes": scopes}
    variants: dict[str, Sampler] = {}
    load_seconds: dict[str, dict[str, float]] = {}
    for seed, (name, count) in enumerate(files.items()):
        begin = time.perf_counter()
        storage = SqlMemoryStorage(bulk_sqlite(work / f"scale-{count}.db", count, facts))
        load_seconds[name] = {"scopes": count, "bulk_load_s": time.perf_counter() - begin}
        variants[name] = _random_reloads(storage, random_users(count, iterations + warmup, seed))
    samples = interleave(variants, iterations, warmup)
    print(f"  scale: built both files in {time.perf_counter() - started:.1f} s", flush=True)
    return _results("scale_cold_load", samples, dict.fromkeys(samples, SQLITE_NORMAL), load_seconds)


def access_tracking(
    work: Path, pg_url: str | None, pg_durability: str, iterations: int, warmup: int
) -> list[Result]:
    """A request's memory path (warm load, render 100 facts, record their access), tracking off vs on.

    Both variants share one database; only the provider's ``access_tracking`` differs. The
    interval (300 s) does not pass during the run, so this is the request path alone: the
    flush is a background thread's batch, one write per fact per interval.
    """
    backends = {"sqlite": (f"sqlite:///{work / 'access.db'}", SQLITE_NORMAL)}
    if pg_url is not None:
        backends["postgresql"] = (pg_url, pg_durability)
    config = get_memory_config()
    user = "bench-access"
    variants: dict[str, Sampler] = {}
    durability: dict[str, str] = {}
    tracking: list[SqlMemoryStorage] = []
    for backend, (url, durable) in backends.items():
        for state, on in (("off", False), ("on", True)):
            set_memory_config(config.model_copy(update={"access_tracking": on}))
            storage = SqlMemoryStorage(url)
            if on:
                tracking.append(storage)
            else:
                assert storage.save(document(LOAD_FACTS), user_id=user)
            text, fact_ids = _render(storage.load(user_id=user))
            assert text and len(fact_ids) == LOAD_FACTS, "every fact must be injected (and recorded)"
            variants[f"{backend}_tracking_{state}"] = timed(functools.partial(_request_path, storage, user))
            durability[f"{backend}_tracking_{state}"] = durable
    set_memory_config(config)
    samples = interleave(variants, iterations, warmup)
    for storage in tracking:
        assert storage.flush_access() == LOAD_FACTS, "the tracked variant did not hold its counts"
    return _results(ACCESS_SCENARIO, samples, durability)


def _request_path(storage: SqlMemoryStorage, user: str) -> None:
    """What ``MemoryMiddleware._render`` does, without the pool hop (noise common to both variants)."""
    _text, fact_ids = _render(storage.load(user_id=user))
    storage.record_access(None, user_id=user, fact_ids=fact_ids)


def _render(memory: dict[str, Any]) -> tuple[str, list[str]]:
    return render_memory(memory, ACCESS_TOKENS, guaranteed_token_budget=ACCESS_TOKENS)
