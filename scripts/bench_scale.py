"""Plain vs partitioned tables (``memstore db partition``) at 10,000,000 facts on PostgreSQL.

Two databases of the benchmark's own, dropped afterwards: the plain one is generated on the server
(``INSERT ... SELECT generate_series``: 100 facts per user, one history row per fact spread over
the last twelve months), the partitioned one is a ``CREATE DATABASE ... TEMPLATE`` copy of it moved
by ``memstore db partition`` (16 hash partitions; that migration's time is a figure of its own).
Then, interleaved so machine drift hits both alike: a cold ``load`` of one user, a ``save`` of one
more fact, a full-text ``search`` in one user's facts and across every user, and ``erase`` of one
user; and once per layout, ``vacuum`` of the history older than six months (row deletes on the
plain layout, dropped month partitions on the partitioned one), then PostgreSQL's ``VACUUM`` of
the history (reclaiming what the deletes left: autovacuum's work otherwise). Runs as the server's superuser,
as an operator does: row-level security is not in the figures.

    MEMSTORE_BENCH_PG_URL=postgresql+psycopg://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python scripts/bench.py --only scale [--quick | --smoke]
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from bench_core import Result, interleave, timed
from bench_search import _vocabulary
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from memstore.queries import ANY_AGENT, FactFilter, erase_user, search_facts
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.maintenance.erase import vacuum
from memstore.storage.sql.maintenance.partition import partition
from memstore.storage.sql.schema.migrate import upgrade

SCENARIO = "scale_partitioned"
SCENARIO_PREFIX = "scale_"
FACTS_PER_USER = 100
PARTITIONS = 16
FULL_FACTS = 10_000_000
FACTS = {"full": FULL_FACTS, "quick": 1_000_000, "smoke": 20_000}
SAMPLES = {"full": 100, "quick": 60, "smoke": 3}
_WORDS = 2_000

_GENERATE = (
    "INSERT INTO memory_scopes (id, user_id, revision) "
    "SELECT s, 'u' || lpad(s::text, 7, '0'), 1 FROM generate_series(1, :users) s",
    "SELECT setval(pg_get_serial_sequence('memory_scopes', 'id'), :users)",
    # Three words per fact from the vocabulary, by two cheap hashes of (user, position).
    "INSERT INTO memory_facts (scope_id, fact_id, position, content, content_key, category, confidence, "
    "created_at, source, extra, added_revision, updated_revision) "
    "SELECT s, 'fact_' || lpad(to_hex(i), 8, '0'), i, c, lower(c), 'context', 0.5, :stamp, 'bench', "
    "'{}', 1, 1 FROM generate_series(1, :users) s, generate_series(0, :per - 1) i, "
    "LATERAL (SELECT CAST(:words AS text[]) AS w) v, "
    "LATERAL (SELECT 'the user ' || w[1 + (s * 7919 + i * 104729) % :nwords] || ' ' "
    "|| w[1 + (s * 31 + i * 17) % :nwords] || ' ' || w[1 + (s + i * i) % :nwords] "
    "|| ' (' || s || '.' || i || ')' AS c) t",
    "INSERT INTO memory_history (scope_id, revision, changed_at, entity, entity_id, action, origin, after, "
    "version) SELECT scope_id, 1, :now - (id % 365) * interval '1 day', 'fact', fact_id, 'insert', 'bench', "
    "jsonb_build_object('content', content), 1 FROM memory_facts",
)


@contextmanager
def _database(server_url: str, name: str, template: str | None = None) -> Iterator[str]:
    url = make_url(server_url).set(drivername="postgresql+psycopg")
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
        try:
            yield url.set(database=name).render_as_string(hide_password=False)
        finally:
            dispose_engines()
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _maintain(url: str) -> None:
    """VACUUM ANALYZE: the state a loaded database settles in (visibility map, statistics)."""
    engine = create_engine(make_url(url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    finally:
        engine.dispose()


def _generate(url: str, facts: int, now: datetime) -> None:
    users = max(facts // FACTS_PER_USER, 1)
    params: dict[str, Any] = {
        "users": users,
        "per": FACTS_PER_USER,
        "stamp": now,
        "now": now,
        "words": _vocabulary()[:_WORDS],
        "nwords": _WORDS,
    }
    with get_engine(url).begin() as conn:
        conn.exec_driver_sql("SET LOCAL maintenance_work_mem = '512MB'")
        for statement in _GENERATE:
            conn.execute(text(statement), params)


def _size_mb(url: str) -> float:
    with get_engine(url).connect() as conn:
        return float(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()) / 2**20


def scale(pg_server: str, durability: str, mode_name: str) -> list[Result]:
    """Both layouts at ``FACTS[mode_name]`` facts; the two databases are dropped afterwards."""
    facts, samples = FACTS[mode_name], SAMPLES[mode_name]
    users = max(facts // FACTS_PER_USER, 1)
    now = datetime.now(UTC)
    tag = uuid.uuid4().hex[:10]
    names = f"memstore_bench_scale_{tag}_plain", f"memstore_bench_scale_{tag}_part"
    print(f"  scale: databases {', '.join(names)} (dropped at the end)", flush=True)
    extra: dict[str, dict[str, float]] = {"plain": {}, "partitioned": {}}
    with _database(pg_server, names[0]) as plain:
        upgrade(plain)
        started = time.perf_counter()
        _generate(plain, facts, now)
        extra["plain"]["bulk_load_s"] = time.perf_counter() - started
        _maintain(plain)
        print(f"  scale: {facts:,} facts generated in {extra['plain']['bulk_load_s']:.0f} s", flush=True)
        dispose_engines()  # a template must have no open connection when it is copied
        with _database(pg_server, names[1], template=names[0]) as parted:
            started = time.perf_counter()
            partition(get_engine(parted), partitions=PARTITIONS)
            extra["partitioned"]["migrate_s"] = time.perf_counter() - started
            print(f"  scale: partitioned in {extra['partitioned']['migrate_s']:.0f} s", flush=True)
            _maintain(parted)
            urls = {"plain": plain, "partitioned": parted}
            for layout, url in urls.items():
                extra[layout].update(facts=facts, users=users, size_mb=_size_mb(url))
            results = _operations(urls, users, samples, durability, extra)
            results += _vacuums(urls, now, durability, extra)
    return results


def _operations(
    urls: dict[str, str], users: int, samples: int, durability: str, extra: dict[str, dict[str, float]]
) -> list[Result]:
    rng = random.Random(7)
    picked = rng.sample(range(1, users + 1), min(users, samples * 6 + 20))
    words = _vocabulary()[:_WORDS]
    variants = {}
    for layout, url in urls.items():
        variants.update(_samplers(layout, SqlMemoryStorage(url), picked, words))
    found = interleave(variants, samples, warmup=2)
    return [
        Result(SCENARIO, name, durability, found[name], extra[name.split("_", 1)[0]]) for name in variants
    ]


def _samplers(layout: str, storage: SqlMemoryStorage, picked: list[int], words: list[str]) -> dict[str, Any]:
    """Each operation of each layout gets the same sequence of users (a quarter of ``picked`` each,
    never shared: an erased user is not loaded again) and of queries, whatever the interleaving."""
    every_user = FactFilter(agent_name=ANY_AGENT)
    loaded, saved, searched, erased = (iter(picked[start::4]) for start in range(4))
    queries, broad = random.Random(11), random.Random(12)

    def user(users: Iterator[int]) -> str:
        return f"u{next(users):07d}"

    def load() -> None:
        assert len(storage.load(user_id=user(loaded))["facts"]) == FACTS_PER_USER

    def save() -> float:
        who = user(saved)
        doc = storage.load(user_id=who)
        fact = {"id": "fact_bench_new", "content": f"{who} likes partitioned tables", "confidence": 0.9}
        doc["facts"].append({**fact, "category": "preference", "createdAt": "2026-11-27T00:00:00Z"})
        start = time.perf_counter()
        assert storage.save(doc, user_id=who)
        return (time.perf_counter() - start) * 1000

    def search_user() -> None:
        search_facts(queries.choice(words), FactFilter(user_id=user(searched)), limit=20, storage=storage)

    def search_all() -> None:
        search_facts(broad.choice(words[1000:]), every_user, limit=20, storage=storage)

    def erase() -> None:
        assert erase_user(user(erased), storage=storage)["memory_facts"] == FACTS_PER_USER

    return {
        f"{layout}_load": timed(load),
        f"{layout}_save": save,
        f"{layout}_search_user": timed(search_user),
        f"{layout}_search_all_users": timed(search_all),
        f"{layout}_erase_user": timed(erase),
    }


def _vacuums(
    urls: dict[str, str], now: datetime, durability: str, extra: dict[str, dict[str, float]]
) -> list[Result]:
    """Once per layout (it is destructive): history older than six months, to a month boundary."""
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    cutoff = (first - timedelta(days=1)).replace(day=1)
    for _ in range(5):
        cutoff = (cutoff - timedelta(days=1)).replace(day=1)
    results = []
    for layout, url in urls.items():
        start = time.perf_counter()
        counts = vacuum(get_engine(url), cutoff)
        seconds = time.perf_counter() - start
        removed = counts["memory_history"]
        print(f"  scale: {layout} vacuum removed {removed:,} history rows in {seconds:.1f} s", flush=True)
        detail = {**extra[layout], "history_rows_removed": removed}
        results.append(Result(SCENARIO, f"{layout}_vacuum_by_month", durability, [seconds * 1000], detail))
        # What the deleted rows still cost: PostgreSQL's own VACUUM of the history (autovacuum's
        # work, which a dropped partition never leaves behind).
        reclaim = _timed_vacuum(url, "memory_history")
        results.append(Result(SCENARIO, f"{layout}_reclaim_history", durability, [reclaim], detail))
    return results


def _timed_vacuum(url: str, table: str) -> float:
    engine = create_engine(make_url(url), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            start = time.perf_counter()
            conn.exec_driver_sql(f"VACUUM {table}")
            return (time.perf_counter() - start) * 1000
    finally:
        engine.dispose()


def scale_table(results: list[Result]) -> str:
    """The two layouts side by side, one row per operation (medians and p95 in ms)."""
    ran = {r.variant: r for r in results if r.scenario == SCENARIO}
    if not ran:
        return ""
    operations = dict.fromkeys(name.split("_", 1)[1] for name in ran)
    lines = [
        "| operation | plain p50 ms | plain p95 ms | partitioned p50 ms | partitioned p95 ms | n |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for operation in operations:
        plain, parted = ran.get(f"plain_{operation}"), ran.get(f"partitioned_{operation}")
        if plain is None or parted is None:
            continue
        lines.append(
            f"| {operation} | {plain.median:.1f} | {plain.p95:.1f} | {parted.median:.1f} | {parted.p95:.1f} "
            f"| {len(plain.samples_ms)} |"
        )
    return "\n".join(lines)
