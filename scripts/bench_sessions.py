"""Short-term session memory (issue 33): append, the prompt's context and compression per backend.

Each backend (SQLite in a temp file, PostgreSQL in the run's own database, Redis) is measured
through ``memstore.ops.sessions`` with ``session_backend`` set by its own ``MemoryConfig``, the
three interleaved in one run, under one tenant made for the run:

- ``session_append_2turns``: one ``append_turns`` call of a user and an assistant turn (token
  counting included). A session takes 5 such appends (10 turns, the default compression
  threshold), then the next session begins, over 20 users; so 1 append in 5 creates its session.
  The caps are raised (``session_max_turns`` 1000, ``session_max_tokens`` 200,000,
  ``session_max_stored_turns`` 10,000) so that no compression is due, hence none is queued,
  while appends and reads are timed; the run checks that none happened.
- ``session_context``: ``session_context`` with the default budget (2,000 tokens) on a session
  holding a summary and 8 raw turns, as a session looks between two compressions.
- ``session_compress_10turns_extract_{off,on}``: the queue job a worker runs for a due session
  (``MemoryUpdater.process`` of a ``session_compress`` context): read the 10-turn session,
  summarise it (extractive summariser: the rules extractor, no LLM), with
  ``session_extract_long_term`` on learn from the summary (rules extraction, load and save of the
  user's long-term document, which starts empty: each sample is a new user), and replace the turns
  by the summary. Storing the 10 turns beforehand is not timed. The Redis backend keeps long-term
  memory in a SQLite file, so its "on" figure includes a SQLite save.

Redis: ``MEMSTORE_BENCH_REDIS_URL`` (``off`` skips it), else ``redis://127.0.0.1:6379/0`` if it
answers. The session store keeps its fixed key prefix (``memstore``); the run's tenant,
``bench-sessions-<hex>``, makes every key it writes start with ``memstore:{=bench-sessions-<hex>:``,
and those keys are deleted at the end.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_core import SQLITE_NORMAL, Result, Sampler, interleave
from bench_data import BENCH_MAX_FACTS
from pydantic import SecretStr

from memstore.capture.conversation import SESSION_COMPRESS, ConversationContext
from memstore.config import MemoryConfig, get_memory_config, set_memory_config
from memstore.ops.sessions import MAX_LIST_LIMIT, append_turns, list_sessions, session_context
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sessions.loader import get_session_store, reset_session_stores
from memstore.storage.sql import SqlMemoryStorage
from memstore.update.updater import MemoryUpdater

SCENARIO_PREFIX = "session_"
APPEND = "session_append_2turns"
CONTEXT = "session_context"
COMPRESS_OFF = "session_compress_10turns_extract_off"
COMPRESS_ON = "session_compress_10turns_extract_on"
REDIS_URL_ENV = "MEMSTORE_BENCH_REDIS_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
APPENDS_PER_SESSION = 5
USERS = 20
TIMING_CAPS: dict[str, Any] = {
    "session_max_turns": 1000,
    "session_max_tokens": 200_000,
    "session_max_stored_turns": 10_000,
}
NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "redis": "Redis"}
FIGURES = (
    (APPEND, "append a user + assistant pair (one call, 2 turns)"),
    (CONTEXT, "`session_context`, default budget (summary + 8 turns)"),
    (COMPRESS_OFF, "compress a 10-turn session, `session_extract_long_term` off"),
    (COMPRESS_ON, "compress a 10-turn session, `session_extract_long_term` on"),
)

_USER_TURNS = (
    "Hi, a quick question before Thursday's release. My name is Dana and I run the platform team.",
    "Some context on the stack first. I work at Northwind on the billing service, mostly in Python.",
    "About the data. I prefer PostgreSQL for anything transactional and SQLite for local tools.",
    "One constraint to keep in mind. I live in Lyon, so our maintenance window is at night, CET.",
    "Last point for today. My main goal is to cut the p95 latency of invoice search below 50 ms.",
)
_ASSISTANT_TURN = (
    "Thanks, noted. For the invoices table, a composite index on (customer_id, issued_at DESC) "
    "serves the list view, and a partial index on unpaid invoices keeps the reminder job cheap. "
    "Check the plan with EXPLAIN (ANALYZE, BUFFERS) on a copy of production data before the "
    "release, and schedule the index build with CONCURRENTLY inside your maintenance window."
)


@dataclass(frozen=True)
class Backend:
    name: str
    durability: str
    timing: MemoryConfig
    """Caps raised: no compression is ever due while appends and reads are timed."""
    compress: dict[str, MemoryConfig]
    """``off`` / ``on``: the default compression threshold, long-term extraction off or on."""


def _pair(index: int) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": _USER_TURNS[index % len(_USER_TURNS)]},
        {"role": "assistant", "content": _ASSISTANT_TURN},
    ]


def _backend(name: str, durability: str, work: Path, database_url: str, redis_url: str | None) -> Backend:
    def config(**settings: Any) -> MemoryConfig:
        return MemoryConfig(
            data_dir=str(work),
            max_facts=BENCH_MAX_FACTS,
            database_url=database_url,
            queue_backend="memory",
            extractor="rules",
            session_backend="redis" if name == "redis" else "database",
            session_redis_url=SecretStr(redis_url) if redis_url else None,
            **settings,
        )

    compress = {
        "off": config(session_extract_long_term=False),
        "on": config(session_extract_long_term=True),
    }
    return Backend(name, durability, config(**TIMING_CAPS), compress)


def redis_server() -> tuple[str | None, str | None]:
    """The Redis URL to measure, or ``None`` and why not."""
    url = os.environ.get(REDIS_URL_ENV) or DEFAULT_REDIS_URL
    if url == "off":
        return None, f"Redis session scenarios skipped: {REDIS_URL_ENV}=off"
    try:
        import redis
        import redis.exceptions

        from memstore.storage.sessions.redis_store import masked_url
    except ImportError:
        return None, "Redis session scenarios skipped: the redis extra is not installed"
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        return None, f"Redis session scenarios skipped: {masked_url(url)} did not answer ({exc})"
    finally:
        client.close()
    return url, None


def redis_durability(url: str) -> str:
    """What the server keeps on a power loss, read from its settings rather than assumed."""
    import redis
    import redis.exceptions

    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        names = ("appendonly", "appendfsync", "save")
        settings = {name: str(client.config_get(name).get(name, "?")) for name in names}
    except redis.exceptions.ResponseError:  # CONFIG disabled (managed servers)
        return "unknown (the server refuses CONFIG GET)"
    finally:
        client.close()
    if settings["appendonly"] == "yes" and settings["appendfsync"] == "always":
        return "power-loss-safe (AOF, appendfsync=always)"
    if settings["appendonly"] == "yes":
        return f"loses up to ~1 s on power loss (AOF, appendfsync={settings['appendfsync']})"
    snapshots = f"RDB snapshots save='{settings['save']}'" if settings["save"] else "no snapshots"
    return f"NOT durable: in memory only (appendonly=no, {snapshots})"


def _delete_redis_keys(url: str, tenant: str) -> int:
    """Every key the run wrote: all lie under the run's tenant, inside the store's key prefix."""
    import redis

    from memstore.storage.sessions.redis_store import RedisSessionStore

    base = RedisSessionStore(url).user_base(tenant, "any")  # <prefix>:{<tenant>:<user>}:
    pattern = base.rsplit(":", 2)[0] + ":*"
    assert tenant in pattern, pattern  # never a pattern wider than the run's own keys
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        doomed = list(client.scan_iter(match=pattern, count=500))
        for start in range(0, len(doomed), 500):
            client.delete(*doomed[start : start + 500])
        return len(doomed)
    finally:
        client.close()


def _appender(backend: Backend, tenant: str) -> Sampler:
    count = itertools.count()

    def sample() -> float:
        index = next(count)
        session = index // APPENDS_PER_SESSION
        set_memory_config(backend.timing)
        start = time.perf_counter()
        append_turns(f"user-{session % USERS}", f"chat-{session}", _pair(index), tenant_id=tenant)
        return (time.perf_counter() - start) * 1000

    return sample


def _compress(updater: MemoryUpdater, user: str, session: str, tenant: str) -> bool:
    context = ConversationContext(session, [], None, user, tenant_id=tenant, kind=SESSION_COMPRESS)
    return updater.process(context)


def _reader(backend: Backend, tenant: str) -> Sampler:
    """A session of a summary and 8 raw turns (set up here), read as the next prompt's context."""
    set_memory_config(backend.timing)
    append_turns("reader", "context", [turn for index in range(5) for turn in _pair(index)], tenant_id=tenant)
    set_memory_config(backend.compress["off"])
    compressed = _compress(MemoryUpdater(config=backend.compress["off"]), "reader", "context", tenant)
    set_memory_config(backend.timing)
    append_turns("reader", "context", [turn for index in range(4) for turn in _pair(index)], tenant_id=tenant)
    read = session_context("reader", "context", tenant_id=tenant)
    if not compressed or not read.summary or len(read.turns) != 8:
        raise RuntimeError(f"{backend.name}: the context session lacks its summary or its 8 turns")

    def sample() -> float:
        set_memory_config(backend.timing)
        start = time.perf_counter()
        session_context("reader", "context", tenant_id=tenant)
        return (time.perf_counter() - start) * 1000

    return sample


def _compressor(backend: Backend, extract: str, tenant: str) -> Sampler:
    """Each sample: a new user's session of 10 turns (untimed), then its compression job."""
    config = backend.compress[extract]
    updater = MemoryUpdater(config=config)  # one per worker: the extractor is built once
    count = itertools.count()

    def sample() -> float:
        user = f"compress-{extract}-{next(count)}"
        set_memory_config(backend.timing)
        append_turns(user, "chat", [turn for index in range(5) for turn in _pair(index)], tenant_id=tenant)
        set_memory_config(config)
        reset_memory_storage()  # the process's long-term store follows this backend's database
        get_memory_storage()
        start = time.perf_counter()
        compressed = _compress(updater, user, "chat", tenant)
        elapsed = (time.perf_counter() - start) * 1000
        if not compressed:
            raise RuntimeError(f"{backend.name}: the 10-turn session was not compressed")
        return elapsed

    return sample


def _results(scenario: str, samples: dict[str, list[float]], backends: list[Backend]) -> list[Result]:
    durability = {backend.name: backend.durability for backend in backends}
    return [Result(scenario, name, durability[name], values) for name, values in samples.items()]


def _check_learning(backends: list[Backend], tenant: str) -> None:
    """Extraction on learned facts and off learned none (checks the scenario, not a timing)."""
    for backend in backends:
        for extract, expected in (("off", False), ("on", True)):
            set_memory_config(backend.compress[extract])
            reset_memory_storage()
            storage = get_memory_storage().for_identity(tenant)
            facts = storage.load(user_id=f"compress-{extract}-0").get("facts") or []
            if bool(facts) != expected:
                raise RuntimeError(f"{backend.name}, extraction {extract}: {len(facts)} facts learned")


def _check_uncompressed(backends: list[Backend], tenant: str) -> None:
    """No session written by the timed appends was compressed (nor is any missing)."""
    for backend in backends:
        set_memory_config(backend.timing)
        found = [
            info
            for user in range(USERS)
            for info in list_sessions(f"user-{user}", tenant_id=tenant, limit=MAX_LIST_LIMIT)
        ]
        if not found or any(info.compressions for info in found):
            raise RuntimeError(f"{backend.name}: a timed session was compressed (or none was stored)")


def sessions(
    work: Path, pg_url: str | None, pg_durability: str, iterations: int, compressions: int, warmup: int
) -> tuple[list[Result], list[str]]:
    """The four session scenarios on every backend available; returns them and the run's notes."""
    tenant = f"bench-sessions-{uuid.uuid4().hex[:12]}"
    notes = [
        "session scenarios: caps raised (session_max_turns 1000) so no compression runs while appends "
        "and context reads are timed; compression is timed separately, as the queue job"
    ]
    redis_url, skipped = redis_server()
    if skipped:
        notes.append(skipped)
    sqlite_url = f"sqlite:///{work / 'sessions.db'}"
    SqlMemoryStorage(sqlite_url)  # migrated before any timing
    backends = [_backend("sqlite", SQLITE_NORMAL, work, sqlite_url, None)]
    if pg_url is not None:
        backends.append(_backend("postgresql", pg_durability, work, pg_url, None))
    if redis_url is not None:
        longterm_url = f"sqlite:///{work / 'sessions-redis-longterm.db'}"
        SqlMemoryStorage(longterm_url)
        backends.append(_backend("redis", redis_durability(redis_url), work, longterm_url, redis_url))
    previous = get_memory_config()
    try:
        return _measure(backends, tenant, iterations, compressions, warmup), notes
    finally:
        set_memory_config(previous)
        reset_memory_storage()
        reset_session_stores()
        if redis_url is not None:
            _delete_redis_keys(redis_url, tenant)


def _measure(
    backends: list[Backend], tenant: str, iterations: int, compressions: int, warmup: int
) -> list[Result]:
    def each(make: Callable[[Backend], Sampler]) -> dict[str, Sampler]:
        return {backend.name: make(backend) for backend in backends}

    for backend in backends:
        get_session_store(backend.timing)  # connected (and the schema checked) before any timing
    appends = each(functools.partial(_appender, tenant=tenant))
    results = _results(APPEND, interleave(appends, iterations, warmup), backends)
    reads = each(functools.partial(_reader, tenant=tenant))
    results += _results(CONTEXT, interleave(reads, iterations, warmup), backends)
    _check_uncompressed(backends, tenant)
    for scenario, extract in ((COMPRESS_OFF, "off"), (COMPRESS_ON, "on")):
        jobs = each(functools.partial(_compressor, extract=extract, tenant=tenant))
        results += _results(scenario, interleave(jobs, compressions, min(warmup, 3)), backends)
    _check_learning(backends, tenant)
    return results


def target_fields() -> list[dict[str, Any]]:
    """Informational ratios for ``bench_report``: each backend's median against SQLite's."""
    fields = []
    for scenario, text in FIGURES:
        for backend in ("postgresql", "redis"):
            fields.append(
                {
                    "key": f"{scenario}_{backend}_vs_sqlite",
                    "text": f"Sessions: {text.replace('`', '')}, {NAMES[backend]} vs SQLite (median)",
                    "subject": (scenario, backend),
                    "ref": (scenario, "sqlite"),
                    "limit": None,
                }
            )
    return fields


def _stat(result: Result | None, stat: str) -> float | None:
    if result is None:
        return None
    return result.median if stat == "p50" else result.p95


def sessions_table(results: list[Result]) -> str:
    """The session scenarios side by side, with each backend's ratio to SQLite; empty if none ran."""
    index = {(r.scenario, r.variant): r for r in results if r.scenario.startswith(SCENARIO_PREFIX)}
    if not index:
        return ""
    lines = [
        "| figure (ms) | n | SQLite | PostgreSQL | Redis | PostgreSQL / SQLite | Redis / SQLite |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for scenario, text in FIGURES:
        ran = {name: index.get((scenario, name)) for name in NAMES}
        base = ran["sqlite"]
        if base is None:
            continue
        for stat in ("p50", "p95"):
            cells = [_stat(ran[name], stat) for name in NAMES]
            reference = base.median if stat == "p50" else base.p95
            ratios = [_stat(ran[name], stat) for name in ("postgresql", "redis")]
            lines.append(
                f"| {text}, {stat} | {len(base.samples_ms)} | "
                + " | ".join("—" if cell is None else f"{cell:.2f}" for cell in cells)
                + " | "
                + " | ".join("—" if ratio is None else f"{ratio / reference:.2f}×" for ratio in ratios)
                + " |"
            )
    return "\n".join(lines)
