"""Search at scale: what a DBA runs over every user, on 1,000,000 facts of 50,000 users.

Facts are varied (unlike the load scenarios' identical scopes): each is a sentence of words drawn
from a 5,000-word vocabulary with a Zipf-like skew, so a common word matches tens of thousands of
facts and a rare one a handful. The queries are single words drawn uniformly from the vocabulary
(a DBA looks for something specific), plus two-word queries; p50 and p95 are over that mix.
Measured, per dialect: ``facts search`` across every user (``queries.search_facts``, one page of
20 with its total), ``facts list`` filtered by user and category, ``stats``, and ``erase`` of one
user. The data is bulk-loaded (Core executemany on SQLite, COPY on PostgreSQL), not timed.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bench_pg
from bench_core import SQLITE_NORMAL, Result, Sampler, timed
from sqlalchemy import insert

from memstore.document import FACT_CATEGORIES, fact_content_key
from memstore.ops.queries import erase_user
from memstore.queries import ANY_AGENT, FactFilter, list_facts, memory_stats, search_facts
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.schema.models import Base

SCENARIO = "search_at_scale"
FULL_USERS = 50_000
FACTS_PER_USER = 20
VOCABULARY = 5_000
_STAMP = datetime(2026, 1, 15, 10, 0, tzinfo=UTC)


def _vocabulary() -> list[str]:
    """Pronounceable made-up words, distinct and stable across runs."""
    syllables = ["ka", "lo", "mi", "ner", "sta", "vu", "quo", "ra", "ten", "shi", "po", "dex", "fa", "gri"]
    rng = random.Random(1)
    words: set[str] = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def _sentences(count: int, words: list[str], seed: int) -> Iterator[str]:
    rng = random.Random(seed)
    cumulative = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(words))))  # Zipf, s = 1
    for _ in range(count):
        yield "the user " + " ".join(rng.choices(words, cum_weights=cumulative, k=rng.randint(6, 14)))


def _fact_rows(users: int, words: list[str]) -> Iterator[dict[str, Any]]:
    sentences = _sentences(users * FACTS_PER_USER, words, 2)
    for user in range(users):
        for position in range(FACTS_PER_USER):
            content = f"{next(sentences)} ({user}.{position})"
            yield {
                "scope_id": user + 1,
                "fact_id": f"fact_{position:08x}",
                "position": position,
                "content": content,
                "content_key": fact_content_key(content),
                "category": FACT_CATEGORIES[(user + position) % len(FACT_CATEGORIES)],
                "confidence": 0.5 + (user * 7 + position) % 50 / 100,
                "created_at": _STAMP,
                "source": "bench",
                "source_error": None,
                "extra": {},
                "added_revision": 1,
                "updated_revision": 1,
            }


def _scope_rows(users: int) -> list[dict[str, Any]]:
    return [
        {
            "id": user + 1,
            "user_id": f"s{user:06d}",
            "agent_name": None,
            "revision": 1,
            "version": "1.0",
            "created_at": _STAMP,
            "updated_at": _STAMP,
        }
        for user in range(users)
    ]


def _bulk_sqlite(path: Path, users: int, words: list[str]) -> str:
    url = f"sqlite:///{path}"
    SqlMemoryStorage(url)  # migrates the empty file to head
    tables = Base.metadata.tables
    rows = _fact_rows(users, words)
    with get_engine(url).begin() as conn:
        conn.exec_driver_sql("PRAGMA cache_size = -262144")  # setup only: keeps index pages in memory
        conn.execute(insert(tables["memory_scopes"]), _scope_rows(users))
        while chunk := list(itertools.islice(rows, 20_000)):
            conn.execute(insert(tables["memory_facts"]), chunk)
    return url


_COPY_COLUMNS = (
    "scope_id, fact_id, position, content, content_key, category, confidence, created_at, source, extra, "
    "added_revision, updated_revision"
)


def _bulk_postgresql(url: str, users: int, words: list[str]) -> str:
    with get_engine(url).begin() as conn:
        conn.execute(insert(Base.metadata.tables["memory_scopes"]), _scope_rows(users))
    conn_pg = bench_pg.connect(url)
    try:
        copy_in = f"COPY memory_facts ({_COPY_COLUMNS}) FROM STDIN"
        with conn_pg.cursor() as cursor, cursor.copy(copy_in) as copy:
            for row in _fact_rows(users, words):
                copy.write_row(
                    (
                        *(row[key] for key in ("scope_id", "fact_id", "position", "content", "content_key")),
                        *(row[key] for key in ("category", "confidence", "created_at", "source")),
                        "{}",
                        1,
                        1,
                    )
                )
        conn_pg.execute("SELECT setval(pg_get_serial_sequence('memory_scopes', 'id'), %s)", (users,))
        conn_pg.execute("ANALYZE")
    finally:
        conn_pg.close()
    return url


def _queries(words: list[str], count: int) -> list[str]:
    rng = random.Random(3)
    singles = [rng.choice(words) for _ in range(count - count // 4)]
    pairs = [f"{rng.choice(words[:500])} {rng.choice(words)}" for _ in range(count // 4)]
    mixed = singles + pairs
    rng.shuffle(mixed)
    return mixed


def _cycle(operation: Callable[[str], object], arguments: list[str]) -> Sampler:
    remaining = iter(arguments * 1000)
    return timed(lambda: operation(next(remaining)))


def _variants(url: str, users: int, words: list[str], searches: int, erasures: int) -> dict[str, Sampler]:
    storage = SqlMemoryStorage(url)
    every_user = FactFilter(agent_name=ANY_AGENT)
    rng = random.Random(4)
    listed = [f"s{rng.randrange(users):06d}" for _ in range(searches)]
    doomed = iter(f"s{user:06d}" for user in rng.sample(range(users), erasures + 5))

    def search(query: str) -> None:
        search_facts(query, every_user, limit=20, storage=storage)

    def listing(user: str) -> None:
        page = list_facts(FactFilter(user_id=user, category="preference"), limit=20, storage=storage)
        assert page.total > 0

    def erase() -> None:
        assert erase_user(next(doomed), storage=storage)["memory_facts"] == FACTS_PER_USER

    return {
        "fulltext": _cycle(search, _queries(words, searches)),
        "list_user_category": _cycle(listing, listed),
        "stats": timed(lambda: memory_stats(storage=storage)),
        "erase_one_user": timed(erase),
    }


def search_at_scale(
    work: Path, pg_server: str | None, pg_durability: str, users: int, searches: int
) -> list[Result]:
    """Each operation on each dialect (PostgreSQL in a database of its own, dropped afterwards).

    Stats and erase get few samples: they are slow, and an erase is destructive.
    """
    words = _vocabulary()
    samples_of = {"stats": 5, "erase_one_user": 10}
    results: list[Result] = []
    with ExitStack() as stack:
        builds: dict[str, tuple[Callable[[], str], str]] = {
            "sqlite": (lambda: _bulk_sqlite(work / "search.db", users, words), SQLITE_NORMAL)
        }
        if pg_server is not None:
            pg_url = stack.enter_context(bench_pg.bench_database(pg_server))
            builds["postgresql"] = (lambda: _bulk_postgresql(pg_url, users, words), pg_durability)
        for backend, (build, durability) in builds.items():
            started = time.perf_counter()
            url = build()
            seconds = time.perf_counter() - started
            print(f"  search at scale: {backend} loaded in {seconds:.0f} s", flush=True)
            extra = {"facts": users * FACTS_PER_USER, "users": users, "bulk_load_s": seconds}
            for name, sampler in _variants(url, users, words, searches, samples_of["erase_one_user"]).items():
                sampler()  # warm-up: first-use costs (plans, page cache) are not the steady state
                samples = [sampler() for _ in range(samples_of.get(name, searches))]
                results.append(Result(SCENARIO, f"{backend}_{name}", durability, samples, extra))
    return results
