"""Relevance scenarios: query-aware injection of 500 facts, and semantic search over 100k facts.

Vectors are random unit vectors of the local model's dimension (384), written straight into
``memory_fact_embeddings``: what is timed is memstore's ranking and search, not a model. The
query's embedding is excluded from the injection scenario and reported separately (the local
model, when the ``local-embeddings`` extra is installed).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from bench_core import SQLITE_NORMAL, Result, Sampler, interleave, timed
from bench_data import bulk_sqlite, document, user_name
from sqlalchemy import Engine, LargeBinary, bindparam, create_engine, event, text

from memstore.config import get_memory_config
from memstore.inject.relevance import RelevanceWeights, fused_scores
from memstore.inject.render import render_memory
from memstore.queries import FactFilter
from memstore.scope import DEFAULT_IDENTITY
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine, load_sqlite_vec
from memstore.storage.sql.search.embeddings import vector_parameter
from memstore.storage.sql.search.semantic import nearest_facts

INJECT_SCENARIO = "inject_query_500"
SEARCH_SCENARIO = "semantic_search_100k"
DIMENSION = 384
MODEL = "bench:random-384"
QUERY = "what should I cook for dinner tonight with my sister"
TOKENS = 2000


def _unit(rows: int, seed: int) -> np.ndarray:
    matrix = np.random.default_rng(seed).standard_normal((rows, DIMENSION)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def write_vectors(engine: Engine, where: str = "", *, model: str = MODEL) -> int:
    """A random vector for every live fact (``where`` narrows), in one executemany per chunk."""
    with engine.begin() as conn:
        rows = conn.execute(
            text(f"SELECT id, scope_id, content_key FROM memory_facts WHERE deleted_revision IS NULL {where}")
        ).all()
        vectors = _unit(len(rows), 7)
        now = datetime.now(UTC)
        dialect = conn.dialect.name
        statement = text(
            "INSERT INTO memory_fact_embeddings"
            " (fact_row_id, scope_id, model, dimension, content_key, vector, embedded_at)"
            " VALUES (:id, :scope, :model, :dim, :key, :vector, :now)"
        )
        if dialect == "sqlite":
            statement = statement.bindparams(bindparam("vector", type_=LargeBinary()))
        for start in range(0, len(rows), 5000):
            chunk = rows[start : start + 5000]
            conn.execute(
                statement,
                [
                    {
                        "id": row.id,
                        "scope": row.scope_id,
                        "model": model,
                        "dim": DIMENSION,
                        "key": row.content_key,
                        "vector": vector_parameter(dialect, vectors[start + offset]),
                        "now": now,
                    }
                    for offset, row in enumerate(chunk)
                ],
            )
    return len(rows)


def _query_aware(storage: SqlMemoryStorage, user: str, query_vector: np.ndarray) -> Sampler:
    """``gateway.ranking.relevance_scores`` and the render, minus the query's embedding."""
    weights = RelevanceWeights.of(get_memory_config())

    def run() -> None:
        memory = storage.load(user_id=user)
        facts = memory["facts"]
        vectors = storage.vectors.fact_vectors((user, None), MODEL, [(f["id"], f["content"]) for f in facts])
        assert len(vectors) == len(facts)
        scores = fused_scores(facts, QUERY, query_vector, vectors, weights)
        render_memory(memory, TOKENS, scores=scores)

    return timed(run)


def inject_query(work: Path, iterations: int, warmup: int) -> list[Result]:
    """500 facts: confidence order (today's path) against query-aware order, same load and render."""
    url = f"sqlite:///{work / 'relevance.db'}"
    storage = SqlMemoryStorage(url)
    user = "bench-relevance"
    assert storage.save(document(500), user_id=user)
    assert write_vectors(get_engine(url)) == 500
    query_vector = _unit(1, 11)[0]
    variants: dict[str, Sampler] = {
        "confidence_order": timed(lambda: render_memory(storage.load(user_id=user), TOKENS)),
        "query_aware": _query_aware(storage, user, query_vector),
    }
    durability = dict.fromkeys(variants, SQLITE_NORMAL)
    embed = _local_query_embedding()
    if embed is not None:
        variants["local_query_embedding"] = embed
        durability["local_query_embedding"] = "n/a (model only)"
    samples = interleave(variants, iterations, warmup)
    return [Result(INJECT_SCENARIO, name, durability[name], values) for name, values in samples.items()]


def _local_query_embedding() -> Sampler | None:
    try:
        from memstore.embedding.local import LocalEmbedder

        embedder = LocalEmbedder()
    except Exception as exc:  # the extra is optional: say so and report nothing
        print(f"  relevance: local model not measured ({exc})", flush=True)
        return None
    return timed(lambda: embedder.embed_query(QUERY))


def semantic_search(
    work: Path, pg_url: str | None, scopes: int, facts: int, iterations: int, warmup: int
) -> list[Result]:
    """Top 10 of ``scopes × facts`` vectors across every scope, and within one user's scope."""
    started = time.perf_counter()
    url = bulk_sqlite(work / "semantic.db", scopes, facts)
    SqlMemoryStorage(url)
    total = write_vectors(get_engine(url))
    extra: dict[str, dict[str, float]] = {"sqlite_exact": {"vectors": total}}
    query = _unit(1, 13)[0]
    engines: dict[str, Engine] = {"sqlite_exact": get_engine(url)}
    native = _sqlite_vec_engine(url)
    if native is not None:
        engines["sqlite_vec"] = native
    if pg_url is not None:
        pg_engine = get_engine(pg_url)
        with pg_engine.begin() as conn:
            conn.execute(text("DELETE FROM memory_fact_embeddings WHERE model = :m"), {"m": MODEL})
        _copy_facts(get_engine(url), pg_engine)
        extra["postgresql_exact"] = {"vectors": write_vectors(pg_engine, f"AND id >= {ID_OFFSET}")}
        engines["postgresql_exact"] = pg_engine
    print(f"  relevance: {total} vectors ready in {time.perf_counter() - started:.1f} s", flush=True)
    variants: dict[str, Sampler] = {}
    for name, engine in engines.items():
        variants[name] = _search(engine, FactFilter(), query)
        user = ("pg-" if name.startswith("postgresql") else "") + user_name(scopes // 2)
        variants[f"{name}_one_user"] = _search(engine, FactFilter(user_id=user), query)
    samples = interleave(variants, iterations, warmup)
    durability = {name: SQLITE_NORMAL if name.startswith("sqlite") else "postgresql" for name in samples}
    return [
        Result(SEARCH_SCENARIO, name, durability[name], values, extra.get(name, {}))
        for name, values in samples.items()
    ]


def _search(engine: Engine, where: FactFilter, query: np.ndarray) -> Sampler:
    def run() -> None:
        page = nearest_facts(engine.connect, where, DEFAULT_IDENTITY, query, model=MODEL, limit=10, offset=0)
        assert page.facts

    return timed(run)


def _sqlite_vec_engine(url: str) -> Engine | None:
    """An engine through pysqlite3, which can load sqlite-vec where this Python's sqlite3 cannot."""
    try:
        import pysqlite3.dbapi2 as dbapi  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print("  relevance: sqlite-vec not measured (no driver here can load extensions)", flush=True)
        return None
    engine = create_engine(url, module=dbapi)
    event.listen(engine, "connect", lambda connection, _record: load_sqlite_vec(connection))
    return engine


FACT_COLUMNS = (
    *("id", "scope_id", "fact_id", "position", "content", "content_key", "category", "confidence"),
    *("added_revision", "updated_revision"),
)
ID_OFFSET = 100_000_000
"""Row ids of the copied scopes and facts start here, clear of the other scenarios' rows."""


def _copy_facts(source: Engine, target: Engine) -> None:
    """The SQLite file's scopes and facts into PostgreSQL, in bulk, under ids of their own."""
    copies = (
        ("memory_scopes", ("id", "user_id", "agent_name", "revision"), ("id",)),
        (
            "memory_facts",
            FACT_COLUMNS,
            ("id", "scope_id"),
        ),
    )
    with source.connect() as read, target.begin() as write:
        for table, columns, ids in copies:
            listed = ", ".join(columns)
            rows = [dict(row._mapping) for row in read.execute(text(f"SELECT {listed} FROM {table}"))]
            for row in rows:
                for column in ids:
                    row[column] += ID_OFFSET
                if table == "memory_scopes":
                    row["user_id"] = f"pg-{row['user_id']}"
            values = ", ".join(":" + column for column in columns)
            if table == "memory_facts":  # extra has a Python-side default only
                listed, values = f"{listed}, extra", f"{values}, '{{}}'"
            insert = text(f"INSERT INTO {table} ({listed}) VALUES ({values})")
            for start in range(0, len(rows), 5000):
                write.execute(insert, rows[start : start + 5000])
