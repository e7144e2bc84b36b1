"""Deterministic benchmark documents, the benchmark's config, and Core bulk-loading of large SQLite files."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from memstore.config import FILE_MAX_FACTS, MemoryConfig, get_memory_config, set_memory_config
from memstore.document import FACT_CATEGORIES, HISTORY_SECTIONS, USER_SECTIONS, fact_content_key
from memstore.storage.file import FileMemoryStorage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.schema.models import Base

# Above 500 on purpose: the save scenario adds a 501st fact, and a cap would turn "add one fact"
# into "add one, tombstone another". The large-scope scenario sets its own cap per size.
BENCH_MAX_FACTS = 1000
STAMP = "2026-01-15T10:00:00Z"
_STAMP_VALUE = datetime(2026, 1, 15, 10, 0, tzinfo=UTC)
_SENTENCE = (
    "prefers concise answers about distributed systems and writes Rust at work on weekdays while "
    "keeping notes in Markdown and reviewing PostgreSQL query plans before every release"
)
_WORDS = _SENTENCE.split()


def use_bench_config(data_dir: Path, **settings: Any) -> None:
    """The process-wide config every benchmarked storage reads (workers call this too)."""
    values: dict[str, Any] = {"max_facts": BENCH_MAX_FACTS, **settings}
    set_memory_config(MemoryConfig.model_construct(data_dir=str(data_dir), **values))


def file_storage(path: Path) -> FileMemoryStorage:
    """The file provider, built under its own cap (it refuses ``max_facts`` past 500); it never
    trims a save itself, so the 501st fact of the save scenario is still written."""
    config = get_memory_config()
    set_memory_config(config.model_copy(update={"max_facts": FILE_MAX_FACTS}))
    try:
        return FileMemoryStorage(path)
    finally:
        set_memory_config(config)


def fact(index: int) -> dict[str, Any]:
    """A realistic fact (~90 characters); ``index`` makes id and content unique within a scope."""
    words = " ".join(_WORDS[(index + k) % len(_WORDS)] for k in range(9))
    category = FACT_CATEGORIES[index % len(FACT_CATEGORIES)]
    item: dict[str, Any] = {
        "id": f"fact_{index:08x}",
        "content": f"Fact {index}: the user {words}",
        "category": category,
        "confidence": round(0.5 + (index * 37 % 50) / 100, 2),
        "createdAt": STAMP,
        "source": f"thread-{index % 7}",
    }
    if category == "correction":
        item["sourceError"] = f"assumed Python {index % 3 + 2} instead"
    return item


def _section(name: str) -> dict[str, str]:
    return {"summary": f"{name}: " + " ".join(_WORDS[:24]), "updatedAt": STAMP}


def document(facts: int) -> dict[str, Any]:
    return {
        "version": "1.0",
        "lastUpdated": STAMP,
        "user": {name: _section(name) for name in USER_SECTIONS},
        "history": {name: _section(name) for name in HISTORY_SECTIONS},
        "facts": [fact(index) for index in range(facts)],
    }


def _fact_row(index: int) -> dict[str, Any]:
    item = fact(index)
    return {
        "fact_id": item["id"],
        "position": index,
        "content": item["content"],
        "content_key": fact_content_key(item["content"]),
        "category": item["category"],
        "confidence": item["confidence"],
        "created_at": _STAMP_VALUE,
        "source": item["source"],
        "source_error": item.get("sourceError"),
        "extra": {},
        "added_revision": 1,
        "updated_revision": 1,
    }


def bulk_sqlite(path: Path, scopes: int, facts_per_scope: int, chunk: int = 2000) -> str:
    """A migrated SQLite file holding ``scopes`` users (``u000000``...), filled with Core executemany."""
    url = f"sqlite:///{path}"
    SqlMemoryStorage(url)  # migrates the empty file to head
    tables = Base.metadata.tables
    engine = get_engine(url)
    fact_rows = [_fact_row(index) for index in range(facts_per_scope)]  # the same in every scope
    for first in range(0, scopes, chunk):
        ids = range(first + 1, min(first + chunk, scopes) + 1)
        with engine.begin() as conn:
            # Setup only, not measured: a big page cache keeps index pages from spilling mid-load.
            conn.exec_driver_sql("PRAGMA cache_size = -262144")
            conn.execute(
                insert(tables["memory_scopes"]),
                [
                    {
                        "id": scope_id,
                        "user_id": user_name(scope_id - 1),
                        "agent_name": None,
                        "revision": 1,
                        "version": "1.0",
                        "created_at": _STAMP_VALUE,
                        "updated_at": _STAMP_VALUE,
                    }
                    for scope_id in ids
                ],
            )
            conn.execute(
                insert(tables["memory_sections"]),
                [
                    {
                        "scope_id": scope_id,
                        "section": name,
                        "summary": _section(name)["summary"],
                        "updated_at": _STAMP_VALUE,
                        "revision": 1,
                        "extra": {},
                    }
                    for scope_id in ids
                    for name in USER_SECTIONS + HISTORY_SECTIONS
                ],
            )
            conn.execute(
                insert(tables["memory_facts"]),
                [{"scope_id": scope_id, **row} for scope_id in ids for row in fact_rows],
            )
    return url


def user_name(index: int) -> str:
    return f"u{index:06d}"


def random_users(scopes: int, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [user_name(rng.randrange(scopes)) for _ in range(count)]
