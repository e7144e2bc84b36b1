"""Which other owners' facts an identity reads: the same rule as the PostgreSQL policies, in SQL
that memstore sends itself, so SQLite (no row-level security) enforces it too.

A fact of another owner in the identity's tenant is readable when it is ``public``, or ``shared``
with the identity's user or one of its roles, or ``shared`` and the identity is ``admin``. A
private fact is its owner's alone, whatever the roles.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Connection, and_, exists, false, func, literal_column, or_, select, true
from sqlalchemy.sql.elements import ColumnElement

from memstore.document import as_utc, format_timestamp
from memstore.record import RAW_KEY, RELATIONS_KEY, STRUCTURED_KEY
from memstore.scope import ADMIN_ROLE, Identity
from memstore.storage.sql.documents.codec import FactValues, decode_fact
from memstore.storage.sql.documents.grants import PRIVATE, SHARED
from memstore.storage.sql.documents.json_values import json_object
from memstore.storage.sql.documents.links import record_of_row
from memstore.storage.sql.documents.statements import agent_is, tenant_is
from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.schema.models import grants_table as _grants
from memstore.storage.sql.schema.models import scopes_table as _scopes
from memstore.storage.sql.search.record_columns import RECORD_FIELD_COLUMNS, tags_of

Connect = Callable[[], AbstractContextManager[Connection]]
"""Opens one read (the provider's ``_reading``: with the identity set where the policies apply)."""

MAX_VISIBLE_FACTS = 500
"""Other owners' facts ``memory_context`` considers; the token budget keeps far fewer."""

_EMPTY: Any = literal_column("''")
# A literal, not a bound parameter: only then can the planner (SQLite's, and PostgreSQL's generic
# plan for a prepared statement) prove the partial index ix_memory_facts_tenant_id_visibility applies.
NOT_PRIVATE: ColumnElement[bool] = _facts.c.visibility != literal_column(f"'{PRIVATE}'")


def readable_by(identity: Identity) -> ColumnElement[bool]:
    """Shared or public facts of the identity's tenant it may read (owner not checked: add it)."""
    granted: list[ColumnElement[bool]] = []
    if identity.user_id is not None:
        granted.append(and_(_grants.c.grantee_kind == "user", _grants.c.grantee == identity.user_id))
    if identity.roles:
        granted.append(and_(_grants.c.grantee_kind == "role", _grants.c.grantee.in_(sorted(identity.roles))))
    shared_to_me: ColumnElement[bool] = (
        exists().where(
            _grants.c.scope_id == _facts.c.scope_id, _grants.c.fact_row_id == _facts.c.id, or_(*granted)
        )
        if granted
        else false()
    )
    if ADMIN_ROLE in identity.roles:
        shared_to_me = true()
    return and_(
        _facts.c.tenant_id == identity.tenant_id,
        or_(_facts.c.visibility == "public", and_(_facts.c.visibility == SHARED, shared_to_me)),
    )


def shares_any(conn: Connection, tenant_id: str) -> bool:
    """Whether the tenant has any live shared or public fact (one probe of a partial index)."""
    probe = (
        select(_facts.c.id)
        .where(
            _facts.c.tenant_id == tenant_id,
            _facts.c.deleted_revision.is_(None),
            NOT_PRIVATE,
        )
        .limit(1)
    )
    return conn.execute(probe).first() is not None


_VISIBLE = select(
    _facts.c.fact_id,
    _facts.c.content,
    _facts.c.category,
    _facts.c.confidence,
    _facts.c.created_at,
    _facts.c.source,
    _facts.c.source_error,
    _facts.c.extra,
    _facts.c.visibility,
    *RECORD_FIELD_COLUMNS,
).select_from(_facts.join(_scopes, _scopes.c.id == _facts.c.scope_id))


def visible_facts(conn: Connection, identity: Identity, agent_name: str | None) -> list[dict[str, Any]]:
    """Live facts of other owners of the agent that ``identity`` may read, as document facts with
    their ``visibility`` (never their grant lists, which name other users); the most confident
    first, at most ``MAX_VISIBLE_FACTS``. One statement: without such facts the partial index
    ``ix_memory_facts_tenant_id_visibility`` answers it from nothing."""
    query = (
        _VISIBLE.where(
            tenant_is(identity.tenant_id),
            agent_is(agent_name),
            func.coalesce(_scopes.c.user_id, _EMPTY) != (identity.user_id or ""),
            _facts.c.deleted_revision.is_(None),
            NOT_PRIVATE,
            readable_by(identity),
        )
        .order_by(_facts.c.confidence.desc(), _facts.c.id)
        .limit(MAX_VISIBLE_FACTS)
    )
    return [_document_fact(row) for row in conn.execute(query)]


def _document_fact(row: Any) -> dict[str, Any]:
    """The fact as ``codec.decode_fact`` makes it for its owner, minus what names others: its grant
    lists and its relations (fact ids of the owner's memory). Built directly when the row has no
    ``extra`` and no record fields (the codec's round trip per fact was most of this read)."""
    extra = json_object(row.extra)
    created_at = as_utc(row.created_at)
    record = record_of_row(row, tags_of(row.tags), ())
    if extra or record is not None:
        values = FactValues(
            row.fact_id,
            row.content,
            row.category,
            row.confidence,
            created_at,
            row.source,
            row.source_error,
            extra,
            row.visibility,
            (),
            record,
        )
        decoded = decode_fact(values)
        # Never another owner's grant lists (kept verbatim in extra when they were given unsorted):
        # they name the other users the fact is shared with; nor the owner's own words and
        # structured form, nor relations naming the owner's other facts: sharing shares the summary.
        for key in ("allowedUsers", "allowedRoles", RELATIONS_KEY, RAW_KEY, STRUCTURED_KEY):
            decoded.pop(key, None)
        return decoded
    fact: dict[str, Any] = {
        "id": row.fact_id,
        "content": row.content,
        "category": row.category,
        "confidence": row.confidence,
    }
    if created_at is not None:
        fact["createdAt"] = format_timestamp(created_at)
    if row.source is not None:
        fact["source"] = row.source
    if row.source_error is not None:
        fact["sourceError"] = row.source_error
    fact["visibility"] = row.visibility
    return fact
