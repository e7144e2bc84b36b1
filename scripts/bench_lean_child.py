#!/usr/bin/env python3
"""One measurement of ``bench_lean.py``, in a process whose ``PYTHONPATH`` picks the memstore tree.

The same file measures the baseline revision and the current checkout, so it touches memstore
only through what both expose: ``set_memory_config``, ``SqlMemoryStorage`` (``load``, ``reload``,
``save``), ``DatabaseUpdateQueue`` with ``MemoryUpdater``s and the metrics registry. It imports
no other benchmark module that imports memstore (those follow the current tree). The task is one
JSON object on stdin; the answer one JSON line on stdout.

Tasks: ``queue`` (conversations through the durable queue against the instant LLM, with every
statement and transaction SQLAlchemy runs counted), ``store`` (cold loads and saves interleaved
with LangGraph's ``SqliteStore`` and one psycopg round trip), ``build`` (the lifecycle database,
through ``save``) and ``profile`` (a queue, load or save figure's work under cProfile: the
current tree's profile behind a missed goal).
"""

from __future__ import annotations

import cProfile
import io
import itertools
import json
import pstats
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench_core import Sampler, interleave, timed
from sqlalchemy import event
from sqlalchemy.engine import Engine

from memstore import metrics
from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig, set_memory_config
from memstore.queue.database import DatabaseUpdateQueue
from memstore.storage.sql import SqlMemoryStorage
from memstore.update.updater import MemoryUpdater

MARKER = "bench conversation"  # bench_llm_server.MARKER: the server names its new fact after it
WAIT_TIMEOUT_SECONDS = 300.0
WAIT_POLL_SECONDS = 0.005
_WRITE = re.compile(r"\b(INSERT|UPDATE|DELETE|BEGIN IMMEDIATE)\b", re.IGNORECASE)
"""A statement that writes, or SQLite's write transaction: its transaction is a write transaction
(``SELECT ... FOR UPDATE`` counts too: it takes a row lock to write)."""
_CONTROL = re.compile(r"\s*(BEGIN|COMMIT|ROLLBACK)\b", re.IGNORECASE)
"""Transaction control, which memstore sends itself on SQLite only (psycopg sends its own BEGIN):
counted as transactions, not as statements, so both dialects count alike."""
_NAMESPACE = ("memory", "bench")


@dataclass
class SqlCounter:
    """Every statement SQLAlchemy sends, and its transactions, on every engine of the process."""

    statements: int = 0
    transactions: int = 0
    write_transactions: int = 0
    writing: set[int] = field(default_factory=set)

    def install(self) -> None:
        event.listen(Engine, "before_cursor_execute", self._statement)
        event.listen(Engine, "commit", self._end)
        event.listen(Engine, "rollback", self._end)

    def reset(self) -> None:
        self.statements = self.transactions = self.write_transactions = 0
        self.writing.clear()

    def snapshot(self) -> dict[str, int]:
        return {
            "statements": self.statements,
            "transactions": self.transactions,
            "write_transactions": self.write_transactions,
        }

    def _statement(self, conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not _CONTROL.match(statement):
            self.statements += 1
        if _WRITE.search(statement):
            self.writing.add(id(conn))

    def _end(self, conn: Any) -> None:
        self.transactions += 1
        if id(conn) in self.writing:
            self.writing.discard(id(conn))
            self.write_transactions += 1


def configure(task: dict[str, Any], url: str, llm: str | None = None) -> None:
    """The benchmark's settings: the real LLM extractor against the local server, a cap of 1,000
    facts (the save scenario's 501st fact is stored, not trimmed), PostgreSQL migrated on first use."""
    set_memory_config(
        MemoryConfig(
            data_dir=task["work"],
            database_url=url,
            auto_migrate=True,
            max_facts=1000,
            model_name="bench-model",
            llm_base_url=llm,
            extractor="llm" if llm else "rules",
            debounce_seconds=300,
            llm_timeout_seconds=60,
        )
    )


def conversation(user: str, index: int) -> ConversationContext:
    """A short exchange (~500 characters) that the server answers with one new fact."""
    messages = [
        {"role": "user", "content": f"This is {MARKER} {user}. I keep my meeting notes in Markdown files."},
        {"role": "assistant", "content": "Noted. Would you like a template with attendees and decisions?"},
        {"role": "user", "content": f"Yes please, and number the action items (request {index})."},
        {"role": "assistant", "content": "Here it is: # Meeting, ## Attendees, ## Decisions, ## Actions."},
    ]
    return ConversationContext(f"thread-{user}", messages, None, user)


class UpdaterPool:
    """Updaters built once and handed to every queue of the child, as a long-running worker keeps
    its own: building one costs ~35 ms of CPU (the OpenAI client), paid in the warm-up only."""

    def __init__(self) -> None:
        self.idle: list[MemoryUpdater] = []
        self.out: list[MemoryUpdater] = []
        self.lock = threading.Lock()

    def take(self) -> MemoryUpdater:
        with self.lock:
            updater = self.idle.pop() if self.idle else MemoryUpdater()
            self.out.append(updater)
            return updater

    def give_back(self) -> None:
        with self.lock:
            self.idle += self.out
            self.out.clear()


CRASHED: list[str] = []
"""Threads that died of an exception: a worker thread that dies leaves its conversations undone."""


def _crashed(args: threading.ExceptHookArgs) -> None:
    CRASHED.append(args.thread.name if args.thread else "?")
    threading.__excepthook__(args)


def _llm_seconds() -> float:
    return metrics.REGISTRY.get_sample_value("memstore_llm_call_seconds_sum") or 0.0


def _enqueue(url: str, storage: SqlMemoryStorage, seed: dict[str, Any], users: list[str]) -> None:
    for user in users:
        assert storage.save(seed, user_id=user)
    queue = DatabaseUpdateQueue(url, workers=0)  # the request path: enqueues, runs nothing
    try:
        for index, user in enumerate(users):
            queue.submit(conversation(user, index), immediately=True)
    finally:
        queue.close()


def _drain(url: str, pool: UpdaterPool, workers: int, count: int) -> float:
    """Start ``workers`` threads on the backlog; seconds until ``count`` conversations are saved."""
    started = time.perf_counter()
    queue = DatabaseUpdateQueue(url, pool.take, workers=workers)
    deadline = time.monotonic() + WAIT_TIMEOUT_SECONDS
    try:
        while (stats := queue.stats).updated + stats.skipped < count:
            if stats.dead or stats.errors or CRASHED or time.monotonic() > deadline:
                raise RuntimeError(f"benchmark queue: {stats} after {time.perf_counter() - started:.1f} s")
            time.sleep(WAIT_POLL_SECONDS)
        elapsed = time.perf_counter() - started
        if stats.skipped:
            raise RuntimeError(f"benchmark queue: {stats.skipped} conversation(s) saved nothing")
    finally:
        queue.shutdown(30.0)
        pool.give_back()
    return elapsed


def queue_run(task: dict[str, Any], counter: SqlCounter) -> dict[str, Any]:
    """One backend and worker layout (a task holds several, run in turn): a warm-up drain of one
    conversation per worker thread, then the measured drain. Both are counted: their difference is
    what the extra conversations cost, without a drain's fixed start and end (each worker's last
    claim finds nothing)."""
    url, workers, count, tag = task["url"], task["workers"], task["conversations"], task["tag"]
    configure(task, url, task["llm"])
    storage = SqlMemoryStorage(url)
    pool = UpdaterPool()
    warm = [f"{tag}-warm-{index}" for index in range(workers)]
    _enqueue(url, storage, task["seed"], warm)
    counter.reset()
    _drain(url, pool, workers, len(warm))
    warm_counts = {f"warm_{name}": value for name, value in counter.snapshot().items()}
    _enqueue(url, storage, task["seed"], [f"{tag}-{index}" for index in range(count)])
    llm = _llm_seconds()
    counter.reset()
    seconds = _drain(url, pool, workers, count)
    counts = counter.snapshot()
    answer = {"seconds": seconds, "llm_seconds": _llm_seconds() - llm, "conversations": count, **counts}
    return answer | warm_counts | {"warm_conversations": len(warm)}


def _save_sampler(
    storage: SqlMemoryStorage | _LangGraph,
    user: str,
    facts: list[dict[str, Any]],
    profiler: cProfile.Profile | None = None,
) -> Sampler:
    """Time a save adding one fact (``profiler``: profile it too); then (untimed, unprofiled)
    remove the fact again so the scope keeps its size."""
    serial = iter(facts)

    def sample() -> float:
        memory = storage.load(user_id=user)
        added = next(serial)
        memory["facts"].append(added)
        start = time.perf_counter()
        saved = (
            storage.save(memory, user_id=user)
            if profiler is None
            else profiler.runcall(storage.save, memory, user_id=user)
        )
        elapsed = (time.perf_counter() - start) * 1000
        assert saved
        memory = storage.load(user_id=user)
        memory["facts"] = [item for item in memory["facts"] if item["id"] != added["id"]]
        assert storage.save(memory, user_id=user)
        return elapsed

    return sample


class _LangGraph:
    """LangGraph's ``SqliteStore`` holding the whole document as one value (WAL, synchronous=NORMAL)."""

    def __init__(self, path: str) -> None:
        import sqlite3

        from langgraph.store.sqlite import SqliteStore

        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        self.store = SqliteStore(conn)
        self.store.setup()

    def load(self, *, user_id: str) -> dict[str, Any]:
        item = self.store.get(_NAMESPACE, user_id)
        assert item is not None
        value: dict[str, Any] = item.value
        return value

    def save(self, memory: dict[str, Any], *, user_id: str) -> bool:
        self.store.put(_NAMESPACE, user_id, memory)
        return True


def store_run(task: dict[str, Any]) -> dict[str, Any]:
    """Cold loads of 100 facts and saves of one more fact, each beside its reference."""
    iterations, warmup, docs = task["iterations"], task["warmup"], task["docs"]
    configure(task, task["sqlite_url"])
    sqlite = SqlMemoryStorage(task["sqlite_url"])
    langgraph = _LangGraph(task["langgraph_path"])
    samples: dict[str, dict[str, list[float]]] = {}
    user = f"{task['tag']}-load"
    assert sqlite.save(docs["100"], user_id=user)
    langgraph.save(docs["100"], user_id=user)
    loads: dict[str, Sampler] = {
        "memstore": timed(lambda: sqlite.reload(user_id=user)),
        "langgraph_sqlite": timed(lambda: langgraph.load(user_id=user)),
    }
    samples["load_cold_100"] = interleave(loads, iterations, warmup)
    if task["pg_url"]:
        samples["load_cold_100_pg"] = _pg_loads(task, user, iterations, warmup)
    extra = iter(docs["extra"])
    for size in ("10", "500"):
        user = f"{task['tag']}-save-{size}"
        assert sqlite.save(docs[size], user_id=user)
        langgraph.save(docs[size], user_id=user)
        saves = {
            "memstore": _save_sampler(sqlite, user, list(itertools.islice(extra, task["saves"] + 3))),
            "langgraph_sqlite": _save_sampler(
                langgraph, user, list(itertools.islice(extra, task["saves"] + 3))
            ),
        }
        samples[f"save_add1_{size}"] = interleave(saves, task["saves"], min(warmup, 3))
    return samples


def _pg_loads(task: dict[str, Any], user: str, iterations: int, warmup: int) -> dict[str, list[float]]:
    import psycopg
    from sqlalchemy.engine import make_url

    url = task["pg_url"]
    storage = SqlMemoryStorage(url)
    assert storage.save(task["docs"]["100"], user_id=user)
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        loads: dict[str, Sampler] = {
            "memstore": timed(lambda: storage.reload(user_id=user)),
            "psycopg_select1": timed(lambda: conn.execute("SELECT 1").fetchone()),
        }
        return interleave(loads, iterations, warmup)


def build(task: dict[str, Any]) -> dict[str, Any]:
    """The lifecycle database: ``scopes`` users each saving the same document through ``save``."""
    configure(task, task["url"])
    storage = SqlMemoryStorage(task["url"])
    started = time.perf_counter()
    for index in range(task["scopes"]):
        assert storage.save(task["doc"], user_id=f"life{index:06d}")
    return {"seconds": time.perf_counter() - started}


def profile(task: dict[str, Any]) -> str:
    """The same work under cProfile: the top of it by cumulative time, as pstats prints it. The
    queue's conversations run through ``flush``: in the caller's thread, the same claim, run and
    settle as a worker's (a profiler sees one thread)."""
    profiler = cProfile.Profile()
    _profiled_work(task, profiler)()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(task["lines"])
    return out.getvalue()


def _profiled_work(task: dict[str, Any], profiler: cProfile.Profile) -> Callable[[], object]:
    """Set up (warm: one conversation, load or save first, unprofiled) and return the work, which
    runs what it measures under ``profiler`` (a save sample: the save alone)."""
    configure(task, task["url"], task.get("llm"))
    storage = SqlMemoryStorage(task["url"])
    if task["what"] == "queue":
        queue = DatabaseUpdateQueue(task["url"], workers=0)
        users = [f"{task['tag']}-{index}" for index in range(task["conversations"] + 1)]
        for index, user in enumerate(users):
            assert storage.save(task["seed"], user_id=user)
            queue.submit(conversation(user, index), immediately=True)
            if index == 0:
                queue.flush()  # the flush updater, its client and every lazy import, outside the profile
        return lambda: profiler.runcall(queue.flush)
    user = task["tag"]
    assert storage.save(task["doc"], user_id=user)
    if task["what"] == "load":
        storage.reload(user_id=user)
        return lambda: profiler.runcall(
            lambda: [storage.reload(user_id=user) for _ in range(task["iterations"])]
        )
    _save_sampler(storage, user, task["extra"][:1])()
    sampler = _save_sampler(storage, user, task["extra"][1:], profiler)
    return lambda: [sampler() for _ in range(task["iterations"])]


def main() -> int:
    task = json.loads(sys.stdin.read())
    threading.excepthook = _crashed
    counter = SqlCounter()
    counter.install()
    kind = task["task"]
    answer: dict[str, Any]
    if kind == "queue":
        answer = {"runs": [queue_run(task | run, counter) for run in task["runs"]]}
    elif kind == "store":
        answer = store_run(task)
    elif kind == "build":
        answer = build(task)
    elif kind == "profile":
        answer = {"profiles": [profile(item | {"work": task["work"]}) for item in task["items"]]}
    else:
        raise SystemExit(f"bench_lean_child: unknown task {kind!r}")
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
