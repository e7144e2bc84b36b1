"""Cross-scope semantic search: the facts whose vectors are nearest a query vector.

Three backends, picked per query by what the database can do (``vector_backend``):

- ``sqlite-vec``: the extension the engine loads into every SQLite connection when the
  ``sqlite-vec`` package is installed; ``vec_distance_cosine`` runs over the stored float32
  blobs in C (an exact scan, no approximate index).
- ``pgvector``: when ``CREATE EXTENSION vector`` has been run, ``real[]`` is cast to
  ``vector(n)`` and ranked by ``<=>`` (cosine distance) in the server; still exact (no
  approximate index, which would filter after its scan).
- ``exact``: otherwise, vectors are streamed in chunks and scored with numpy, keeping only the
  best ``offset + limit``. Correct everywhere, linear in the number of vectors.

Every backend applies the same ``FactFilter`` conditions as full-text search, so a search for
one user never sees another user's facts. Similarity is cosine (vectors are stored normalised),
reported as the record's ``rank``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Connection, Float, LargeBinary, bindparam, cast, func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import UserDefinedType

from memstore.embedding.vectors import to_blob
from memstore.scope import Identity
from memstore.storage.records import FactFilter, FactPage
from memstore.storage.sql.schema.models import embeddings_table as _vectors
from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.schema.models import scopes_table as _scopes
from memstore.storage.sql.search.embeddings import stored_vector, vector_matrix
from memstore.storage.sql.search.queries import (
    LIVE_FACTS,
    RECORD_COLUMNS,
    fact_conditions,
    fact_page,
    fact_record,
    scope_conditions,
)
from memstore.storage.sql.search.visibility import Connect, shares_any

if TYPE_CHECKING:
    import numpy as np

VectorBackend = Literal["sqlite-vec", "pgvector", "exact"]
_SCAN_CHUNK = 5000

_WITH_VECTOR = LIVE_FACTS.join(
    _vectors,
    (_vectors.c.scope_id == _facts.c.scope_id)
    & (_vectors.c.fact_row_id == _facts.c.id)
    & (_vectors.c.content_key == _facts.c.content_key),
)


def vector_backend(conn: Connection) -> VectorBackend:
    """What serves semantic search on this connection's database (checked per call; it is cheap)."""
    if conn.dialect.name == "sqlite":
        try:
            conn.execute(text("SELECT vec_version()"))
        except DBAPIError:
            return "exact"
        return "sqlite-vec"
    found = conn.execute(text("SELECT 1 FROM pg_extension WHERE extname = 'vector'")).first()
    return "pgvector" if found is not None else "exact"


def nearest_facts(
    engine: Connect,
    where: FactFilter,
    identity: Identity,
    vector: np.ndarray,
    *,
    model: str,
    limit: int,
    offset: int,
) -> FactPage:
    """Live facts matching ``where`` (as ``identity`` may read them) ranked by cosine similarity to
    ``vector`` under ``model``."""
    dimension = int(vector.shape[0])
    with engine() as conn:
        conditions = [
            *fact_conditions(conn, where, identity),
            _vectors.c.model == bindparam("b_model", model),
            _vectors.c.dimension == dimension,
        ]
        if where.user_id is not None and not shares_any(conn, identity.tenant_id):
            # Lead with the user's scopes: without statistics, SQLite would walk every vector of the
            # model and join each to its fact (110 ms instead of 1 ms for one user among 100,000).
            own = select(_scopes.c.id).where(*scope_conditions(where, identity.tenant_id))
            conditions.append(_vectors.c.scope_id.in_(own))
        backend = vector_backend(conn)
        if backend == "exact":
            return _exact(conn, conditions, vector, limit, offset)
        distance = _distance(backend, vector, dimension)
        query = (
            select(*RECORD_COLUMNS, (1 - distance).label("rank")).select_from(_WITH_VECTOR).where(*conditions)
        )
        # Exact and stable on both backends: ties go to the more confident fact, then the older row,
        # and a zero vector (no distance) comes last. An approximate index cannot serve this order,
        # on purpose: it would filter after the index scan and could return fewer than ``limit``.
        order = (distance.asc().nulls_last(), _facts.c.confidence.desc(), _facts.c.id)
        return fact_page(conn, query, order, limit, offset, f"semantic:{backend}")


class _PgVector(UserDefinedType[Any]):
    """pgvector's ``vector(n)``, named only in casts: no column has this type."""

    cache_ok = True

    def __init__(self, dimension: int) -> None:
        self.dimension = dimension

    def get_col_spec(self, **_: Any) -> str:
        return f"vector({self.dimension})"


def _distance(backend: VectorBackend, vector: np.ndarray, dimension: int) -> ColumnElement[float]:
    """Cosine distance (1 - similarity) to ``vector``, in the backend's own function or operator."""
    if backend == "sqlite-vec":
        blob = bindparam("b_query", to_blob(vector), type_=LargeBinary())
        return func.vec_distance_cosine(_vectors.c.vector, blob)
    literal = "[" + ",".join(repr(float(value)) for value in vector) + "]"
    return cast(_vectors.c.vector, _PgVector(dimension)).op("<=>", return_type=Float())(
        cast(bindparam("b_query", literal), _PgVector(dimension))
    )


def _exact(
    conn: Connection, conditions: list[ColumnElement[bool]], vector: np.ndarray, limit: int, offset: int
) -> FactPage:
    """Score every candidate vector with numpy, a chunk at a time, keeping the best ``offset + limit``."""
    import numpy as np

    keep = offset + limit
    dialect = conn.dialect.name
    dimension = int(vector.shape[0])
    best_scores = np.empty(0, dtype=np.float32)
    best_ids = np.empty(0, dtype=np.int64)
    best_scopes = np.empty(0, dtype=np.int64)
    total = 0
    scan = (
        select(_facts.c.id, _facts.c.scope_id, stored_vector(dialect).label("raw"))
        .select_from(_WITH_VECTOR)
        .where(*conditions)
    )
    result = conn.execution_options(yield_per=_SCAN_CHUNK).execute(scan)
    for chunk in result.partitions(_SCAN_CHUNK):
        total += len(chunk)
        scores = np.concatenate(
            [best_scores, vector_matrix([row.raw for row in chunk], dimension, dialect) @ vector]
        )
        ids = np.concatenate([best_ids, np.fromiter((row.id for row in chunk), np.int64, len(chunk))])
        scopes = np.concatenate(
            [best_scopes, np.fromiter((row.scope_id for row in chunk), np.int64, len(chunk))]
        )
        best = np.lexsort((ids, -scores))[:keep]  # most similar first; ties favour older rows
        best_scores, best_ids, best_scopes = scores[best], ids[best], scopes[best]
    ranked = list(zip(best_scores.tolist(), best_ids.tolist(), strict=True))[offset:]
    if not ranked:
        return FactPage([], total, limit, offset, "semantic:exact")
    rows = conn.execute(
        select(*RECORD_COLUMNS, _facts.c.id.label("row_id"))
        .select_from(LIVE_FACTS)
        # The scopes too: on a distributed PostgreSQL, they name the shards to read (docs/scale.md).
        .where(
            _facts.c.scope_id.in_(sorted(set(best_scopes[offset:].tolist()))),
            _facts.c.id.in_([row_id for _, row_id in ranked]),
        )
    ).all()
    by_id = {row.row_id: row for row in rows}
    records = [fact_record(by_id[row_id], rank=score) for score, row_id in ranked if row_id in by_id]
    return FactPage(records, total, limit, offset, "semantic:exact")
