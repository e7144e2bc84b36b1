"""Fact vectors in ``memory_fact_embeddings``: write, read per scope, find what is missing.

A vector belongs to one fact row and is valid only while its ``content_key`` equals the fact's
and its ``model`` is the configured one; anything else counts as missing, so an edited fact or a
model change never ranks by a vector of other text or another model. Writing a vector is not a
content change: no revision, no audit row, no cache invalidation.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, and_, bindparam, func, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql.elements import ColumnElement

from memstore.document import fact_content_key
from memstore.embedding.vectors import to_blob
from memstore.errors import EmbeddingError
from memstore.scope import DEFAULT_TENANT_ID, Scope
from memstore.storage.sql.documents.statements import MAX_BOUND_IDS, SCOPE_MATCH, scope_keys
from memstore.storage.sql.schema.models import embeddings_table as _vectors
from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.schema.models import scopes_table as _scopes
from memstore.storage.vectors import UnembeddedFact

if TYPE_CHECKING:
    import numpy as np

_CURRENT = and_(
    _vectors.c.scope_id == _facts.c.scope_id,
    _vectors.c.fact_row_id == _facts.c.id,
    _vectors.c.model == bindparam("b_model"),
    _vectors.c.content_key == _facts.c.content_key,
)


def stored_vector(dialect: str) -> ColumnElement[Any]:
    """The vector column as this module reads it: raw float32 bytes on SQLite; on PostgreSQL
    ``array_send``'s binary array, which numpy parses in one call (text ``real[]`` costs a Python
    float per element, about 40 times slower: 17 s instead of under a second for 100,000 vectors)."""
    return func.array_send(_vectors.c.vector) if dialect == "postgresql" else _vectors.c.vector


def _scope_vectors(dialect: str) -> Any:
    return (
        select(
            _facts.c.fact_id,
            _vectors.c.content_key,
            _vectors.c.dimension,
            stored_vector(dialect).label("raw"),
        )
        .select_from(_facts.join(_scopes, _scopes.c.id == _facts.c.scope_id).join(_vectors, _CURRENT))
        .where(
            SCOPE_MATCH,
            _facts.c.deleted_revision.is_(None),
            _facts.c.fact_id.in_(bindparam("b_fact_ids", expanding=True)),
        )
    )


_SCOPE_VECTORS = {dialect: _scope_vectors(dialect) for dialect in ("postgresql", "sqlite")}

_VECTOR_COLUMNS = ["fact_row_id", "scope_id", "model", "dimension", "content_key", "vector", "embedded_at"]
# Only for a live fact whose content is still what was embedded: a fact edited or deleted while
# its text was with the embedding endpoint gets no vector (it is embedded again later).
_VECTOR_SOURCE = (
    select(
        _facts.c.id,
        _facts.c.scope_id,
        bindparam("b_model"),
        bindparam("b_dimension"),
        _facts.c.content_key,
        bindparam("b_vector", type_=_vectors.c.vector.type),
        bindparam("b_now", type_=_vectors.c.embedded_at.type),
    )
    .join(_scopes, _scopes.c.id == _facts.c.scope_id)
    .where(
        SCOPE_MATCH,
        _facts.c.deleted_revision.is_(None),
        _facts.c.fact_id == bindparam("b_fact_id"),
        _facts.c.content_key == bindparam("b_content_key"),
    )
)


def _upsert_vector(dialect: str) -> Any:
    """Insert or replace a fact's vector in one statement: two writers embedding one fact at once
    (the worker and ``memstore embed``, two first searches) both succeed, the later one's row stays."""
    if dialect == "postgresql":  # by name: on the partitioned layout the key is (fact_row_id, scope_id)
        upsert = postgresql_insert(_vectors).from_select(_VECTOR_COLUMNS, _VECTOR_SOURCE)
        return upsert.on_conflict_do_update(constraint="pk_memory_fact_embeddings", set_=_replaced(upsert))
    statement = sqlite_insert(_vectors).from_select(_VECTOR_COLUMNS, _VECTOR_SOURCE)
    return statement.on_conflict_do_update(index_elements=["fact_row_id"], set_=_replaced(statement))


def _replaced(statement: Any) -> dict[str, Any]:
    """Every column but the key, from the row that lost the conflict (``excluded``)."""
    return {name: statement.excluded[name] for name in _VECTOR_COLUMNS if name != "fact_row_id"}


_UPSERT_VECTOR = {dialect: _upsert_vector(dialect) for dialect in ("postgresql", "sqlite")}

_FACT_ROW = (
    _facts.c.id,
    _scopes.c.user_id,
    _scopes.c.agent_name,
    _facts.c.fact_id,
    _facts.c.content,
    _scopes.c.tenant_id,
)
_IN_ORDER = (_facts.c.deleted_revision.is_(None), _facts.c.id > bindparam("b_after"))
_LIVE_BY_ROW = (
    select(*_FACT_ROW)
    .select_from(_facts.join(_scopes, _scopes.c.id == _facts.c.scope_id))
    .where(*_IN_ORDER)
    .order_by(_facts.c.id)
    .limit(bindparam("b_limit"))
)
_MISSING = (
    select(*_FACT_ROW)
    .select_from(_facts.join(_scopes, _scopes.c.id == _facts.c.scope_id).outerjoin(_vectors, _CURRENT))
    .where(*_IN_ORDER, _vectors.c.fact_row_id.is_(None))
    .order_by(_facts.c.id)
    .limit(bindparam("b_limit"))
)

_MODEL_COUNTS = (
    select(_vectors.c.model, _vectors.c.dimension, func.count())
    .select_from(
        _vectors.join(
            _facts, and_(_facts.c.scope_id == _vectors.c.scope_id, _facts.c.id == _vectors.c.fact_row_id)
        )
    )
    .where(_facts.c.deleted_revision.is_(None), _vectors.c.content_key == _facts.c.content_key)
    .group_by(_vectors.c.model, _vectors.c.dimension)
    .order_by(_vectors.c.model)
)
_LIVE_COUNT = select(func.count()).select_from(_facts).where(_facts.c.deleted_revision.is_(None))


def vector_parameter(dialect: str, vector: np.ndarray) -> Any:
    """``vector`` as the column takes it: float32 bytes on SQLite, a float list for ``real[]``."""
    if dialect == "postgresql":
        return [float(value) for value in vector]
    return to_blob(vector)


_PG_ARRAY_HEADER = 20
"""``array_send`` of a one-dimensional array: ndim, has-nulls flag, element type, length, lower bound."""
_PG_ELEMENT = [("length", ">i4"), ("value", ">f4")]
"""One ``real`` element of the array: its length, then its big-endian value (a numpy dtype)."""
_PG_FLOAT4 = 700
"""The type oid of ``real``."""


def vector_matrix(raws: Sequence[bytes], dimension: int, dialect: str) -> np.ndarray:
    """Vectors read through ``stored_vector`` as one float32 matrix, one row each, parsed in one call.

    A value of another length or shape (a corrupt row) is an ``EmbeddingError``, never a misaligned matrix.
    """
    import numpy as np

    if dialect != "postgresql":
        if any(len(raw) != dimension * 4 for raw in raws):
            raise EmbeddingError(f"a stored vector is not {dimension} float32 values")
        return np.frombuffer(b"".join(raws), dtype="<f4").reshape(len(raws), dimension).astype(np.float32)
    # One dimension, no NULL element, float4 elements, ``dimension`` of them (the lower bound may vary).
    head = struct.pack(">iiii", 1, 0, _PG_FLOAT4, dimension)
    element = np.dtype(_PG_ELEMENT)
    size = _PG_ARRAY_HEADER + dimension * element.itemsize
    if any(len(raw) != size or bytes(raw[:16]) != head for raw in raws):
        raise EmbeddingError(f"a stored vector is not {dimension} float32 values")
    elements = np.frombuffer(b"".join(bytes(raw)[_PG_ARRAY_HEADER:] for raw in raws), dtype=element)
    return elements["value"].astype(np.float32).reshape(len(raws), dimension)


def scope_vectors(
    conn: Connection, tenant_id: str, scope: Scope, model: str, fact_ids: Sequence[str]
) -> dict[str, tuple[str, np.ndarray]]:
    """The valid vectors of the named live facts: fact id to (content key, vector)."""
    keys = scope_keys(scope, tenant_id)
    statement = _SCOPE_VECTORS[conn.dialect.name]
    by_dimension: dict[int, list[Any]] = {}
    for start in range(0, len(fact_ids), MAX_BOUND_IDS):
        chunk = list(fact_ids[start : start + MAX_BOUND_IDS])
        for row in conn.execute(statement, {**keys, "b_model": model, "b_fact_ids": chunk}):
            by_dimension.setdefault(row.dimension, []).append(row)
    found: dict[str, tuple[str, np.ndarray]] = {}
    for dimension, rows in by_dimension.items():
        matrix = vector_matrix([row.raw for row in rows], dimension, conn.dialect.name)
        found.update(
            (row.fact_id, (row.content_key, vector)) for row, vector in zip(rows, matrix, strict=True)
        )
    return found


def store_vectors(
    conn: Connection,
    tenant_id: str,
    scope: Scope,
    model: str,
    items: Iterable[tuple[str, str, np.ndarray]],
    now: datetime,
) -> int:
    """Replace the vectors of ``(fact id, embedded content, vector)``; returns how many were written."""
    keys = scope_keys(scope, tenant_id)
    dialect = conn.dialect.name
    written = 0
    for fact_id, content, vector in items:
        bound = {**keys, "b_fact_id": fact_id, "b_content_key": fact_content_key(content)}
        result = conn.execute(
            _UPSERT_VECTOR[dialect],
            {
                **bound,
                "b_model": model,
                "b_dimension": int(vector.shape[0]),
                "b_vector": vector_parameter(dialect, vector),
                "b_now": now,
            },
        )
        written += max(result.rowcount, 0)
    return written


def unembedded_facts(
    conn: Connection,
    model: str,
    *,
    limit: int,
    after: int = 0,
    scope: Scope | None = None,
    tenant_id: str = DEFAULT_TENANT_ID,
) -> list[UnembeddedFact]:
    """Live facts without a valid vector under ``model``, in row order from ``after``."""
    query = _MISSING
    params: dict[str, Any] = {"b_model": model, "b_after": after, "b_limit": limit}
    if scope is not None:
        query = query.where(SCOPE_MATCH)
        params.update(scope_keys(scope, tenant_id))
    return [UnembeddedFact(*row) for row in conn.execute(query, params)]


def all_live_facts(conn: Connection, *, limit: int, after: int = 0) -> list[UnembeddedFact]:
    """Every live fact by row id, for a rebuild that re-embeds what already has a vector."""
    return [UnembeddedFact(*row) for row in conn.execute(_LIVE_BY_ROW, {"b_after": after, "b_limit": limit})]


def vector_counts(conn: Connection) -> tuple[int, dict[tuple[str, int], int]]:
    """How many live facts exist, and their valid vectors per (model, dimension)."""
    vectors = {(row[0], row[1]): row[2] for row in conn.execute(_MODEL_COUNTS)}
    return conn.execute(_LIVE_COUNT).scalar_one(), vectors
