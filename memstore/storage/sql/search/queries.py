"""Read-only queries across scopes, answered by SQL without loading whole documents.

Every query joins ``memory_facts`` to ``memory_scopes`` and reads live facts only (tombstones
are bookkeeping, not memory). Full-text search is ``fulltext.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Select,
    and_,
    column,
    exists,
    func,
    or_,
    select,
    table,
)
from sqlalchemy.sql.elements import ColumnElement

from memstore.document import as_utc
from memstore.retention import RetentionPolicy
from memstore.scope import Identity, Scope
from memstore.storage.records import (
    ANY_AGENT,
    MAX_SCORED_FACTS,
    FactFilter,
    FactOrder,
    FactPage,
    FactRecord,
    HistoryEntry,
    MemoryStats,
    by_score,
    with_scores,
)
from memstore.storage.sql.documents.statements import agent_is, tenant_is, user_is
from memstore.storage.sql.schema.fts_schema import FTS_TABLE
from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.schema.models import history_table as _history
from memstore.storage.sql.schema.models import scopes_table as _scopes
from memstore.storage.sql.schema.models import tags_table as _tags
from memstore.storage.sql.search.record_columns import RECORD_FIELD_COLUMNS, tags_of
from memstore.storage.sql.search.visibility import Connect, readable_by, shares_any

_fts = table(FTS_TABLE, column("rowid"))


RECORD_COLUMNS = (
    _scopes.c.user_id,
    _scopes.c.agent_name,
    _facts.c.fact_id,
    _facts.c.content,
    _facts.c.category,
    _facts.c.confidence,
    _facts.c.created_at,
    _facts.c.source,
    _facts.c.last_confirmed_at,
    _facts.c.last_accessed_at,
    _facts.c.access_count,
    _facts.c.visibility,
    *RECORD_FIELD_COLUMNS,
)
LIVE_FACTS = _facts.join(_scopes, _scopes.c.id == _facts.c.scope_id)


_ORDERS: dict[str, tuple[Any, ...]] = {
    "newest": (_facts.c.created_at.desc().nulls_last(), _facts.c.id.desc()),
    "last_accessed": (_facts.c.last_accessed_at.desc().nulls_last(), _facts.c.id.desc()),
    "access_count": (_facts.c.access_count.desc(), _facts.c.id.desc()),
}


def query_facts(
    engine: Connect,
    where: FactFilter,
    *,
    limit: int,
    offset: int,
    order: FactOrder = "newest",
    policy: RetentionPolicy,
    identity: Identity,
) -> FactPage:
    """One page of live facts in ``order``, each with its retention ``score`` under ``policy``
    (a search is ``fulltext.search_facts``).

    ``score`` reads every matching fact (at most ``MAX_SCORED_FACTS``) because the score depends
    on the time of the query.
    """
    with engine() as conn:
        conditions = fact_conditions(conn, where, identity)
        query = select(*RECORD_COLUMNS).select_from(LIVE_FACTS).where(*conditions)
        if order != "score":
            page = fact_page(conn, query, _ORDERS[order], limit, offset, "filter")
            return replace(page, facts=with_scores(page.facts, policy, datetime.now(UTC)))
        rows = conn.execute(query.order_by(*_ORDERS["newest"]).limit(MAX_SCORED_FACTS + 1)).all()
    ranked = by_score([fact_record(row) for row in rows], policy, datetime.now(UTC))
    return FactPage(ranked[offset : offset + limit], len(ranked), limit, offset, "filter")


def fact_page(
    conn: Connection,
    query: Select[Any],
    order: Sequence[Any],
    limit: int,
    offset: int,
    mode: str,
) -> FactPage:
    total = conn.execute(select(func.count()).select_from(query.order_by(None).subquery())).scalar_one()
    rows = conn.execute(query.order_by(*order).limit(limit).offset(offset)).all()
    return FactPage([fact_record(row) for row in rows], total, limit, offset, mode)


def fact_record(row: Any, *, rank: float | None = None) -> FactRecord:
    return FactRecord(
        user_id=row.user_id,
        agent_name=row.agent_name,
        fact_id=row.fact_id,
        content=row.content,
        category=row.category,
        confidence=row.confidence,
        created_at=as_utc(row.created_at),
        source=row.source,
        rank=rank if rank is not None else getattr(row, "rank", None),
        visibility=row.visibility,
        last_confirmed_at=as_utc(row.last_confirmed_at),
        last_accessed_at=as_utc(row.last_accessed_at),
        access_count=row.access_count,
        memory_type=row.memory_type,
        importance=row.importance,
        tags=tags_of(row.tags),
        source_kind=row.source_kind,
        raw=row.raw,
        structured=row.structured,
        version=row.version,
    )


def scope_conditions(where: FactFilter, tenant_id: str) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = [tenant_is(tenant_id)]
    if where.user_id is not None:
        conditions.append(user_is(where.user_id))
    if where.agent_name is not ANY_AGENT:
        conditions.append(agent_is(where.agent_name))
    return conditions


def fact_conditions(conn: Connection, where: FactFilter, identity: Identity) -> list[ColumnElement[bool]]:
    """The filter's facts as ``identity`` may read them: inside its tenant, and for a named user
    that user's own facts plus the shared and public facts of others it may read."""
    conditions: list[ColumnElement[bool]] = [
        _facts.c.deleted_revision.is_(None),
        _facts.c.tenant_id == identity.tenant_id,
    ]
    if where.user_id is not None:
        # The user's scopes first: with no statistics, SQLite otherwise started from every fact of
        # the filtered category (200,000 of a million) and joined each to its scope.
        own: ColumnElement[bool] = _facts.c.scope_id.in_(
            select(_scopes.c.id).where(*scope_conditions(where, identity.tenant_id))
        )
        if shares_any(conn, identity.tenant_id):  # one probe of a partial index; usually none
            reader = replace(identity, user_id=where.user_id)
            others = [
                readable_by(reader),
                *scope_conditions(replace(where, user_id=None), identity.tenant_id),
            ]
            own = or_(own, and_(*others))
        conditions.append(own)
    else:
        conditions.extend(scope_conditions(where, identity.tenant_id))
    if where.category is not None:
        category: ColumnElement[Any] = _facts.c.category
        if where.user_id is not None:  # and off the category index, which would skip the sort
            category = category.concat("")
        conditions.append(category == where.category)
    if where.min_confidence is not None:
        conditions.append(_facts.c.confidence >= where.min_confidence)
    if where.visibility is not None:
        conditions.append(_facts.c.visibility == where.visibility)
    conditions.extend(record_conditions(where, identity.tenant_id))
    if where.text:
        conditions.append(_facts.c.content.icontains(where.text, autoescape=True))
    if where.created_after is not None:
        conditions.append(_facts.c.created_at >= where.created_after)
    if where.created_before is not None:
        conditions.append(_facts.c.created_at < where.created_before)
    return conditions


def record_conditions(where: FactFilter, tenant_id: str) -> list[ColumnElement[bool]]:
    """The filter's fact id and record-field conditions (``memstore.record``): type, tag,
    importance, source kind."""
    conditions: list[ColumnElement[bool]] = []
    if where.fact_id is not None:
        conditions.append(_facts.c.fact_id == where.fact_id)
    if where.memory_type is not None:
        conditions.append(_facts.c.memory_type == where.memory_type)
    if where.tag is not None:
        # tenant_id first: the (tenant_id, tag) index finds the tagged rows.
        tagged = exists().where(
            _tags.c.tenant_id == tenant_id,
            _tags.c.tag == where.tag,
            _tags.c.scope_id == _facts.c.scope_id,
            _tags.c.fact_row_id == _facts.c.id,
        )
        conditions.append(tagged)
    if where.min_importance is not None:
        conditions.append(_facts.c.importance >= where.min_importance)
    if where.source_kind is not None:
        conditions.append(_facts.c.source_kind == where.source_kind)
    return conditions


def memory_stats(engine: Engine) -> MemoryStats:
    with engine.connect() as conn:
        users, scopes = conn.execute(select(func.count(_scopes.c.user_id.distinct()), func.count())).one()
        by_category = {
            category: count
            for category, count in conn.execute(
                select(_facts.c.category, func.count())
                .where(_facts.c.deleted_revision.is_(None))
                .group_by(_facts.c.category)
                .order_by(_facts.c.category)
            )
        }
        size = _database_bytes(conn)
    return MemoryStats(users, scopes, sum(by_category.values()), by_category, size)


def _database_bytes(conn: Connection) -> int | None:
    if conn.dialect.name == "postgresql":
        size = conn.execute(select(func.pg_database_size(func.current_database()))).scalar_one()
        return int(size)
    page_count = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
    page_size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
    return int(page_count) * int(page_size)


def list_tenants(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        query = select(_scopes.c.tenant_id).distinct().order_by(_scopes.c.tenant_id)
        return list(conn.execute(query).scalars())


def list_scopes(engine: Connect, tenant_id: str, user_id: str | None) -> list[Scope]:
    query = (
        select(_scopes.c.user_id, _scopes.c.agent_name)
        .where(tenant_is(tenant_id))
        .order_by(func.coalesce(_scopes.c.user_id, ""), func.coalesce(_scopes.c.agent_name, ""))
    )
    if user_id is not None:
        query = query.where(user_is(user_id))
    with engine() as conn:
        return [(row.user_id, row.agent_name) for row in conn.execute(query)]


def fact_history(
    engine: Connect, where: FactFilter, identity: Identity, *, fact_id: str | None, limit: int
) -> list[HistoryEntry]:
    """The newest ``limit`` audit rows for the filtered scopes, oldest first. Only the scopes' own:
    a fact shared now may have held other text while it was private, so its past stays its owner's."""
    conditions: list[ColumnElement[bool]] = scope_conditions(where, identity.tenant_id)
    if fact_id is not None:
        conditions.append(and_(_history.c.entity == "fact", _history.c.entity_id == fact_id))
    query = (
        select(_scopes.c.user_id, _scopes.c.agent_name, _history)
        .select_from(_history.join(_scopes, _scopes.c.id == _history.c.scope_id))
        .where(*conditions)
        .order_by(_history.c.id.desc())
        .limit(limit)
    )
    with engine() as conn:
        rows = conn.execute(query).all()
    return [
        HistoryEntry(
            user_id=row.user_id,
            agent_name=row.agent_name,
            revision=row.revision,
            changed_at=as_utc(row.changed_at),
            entity=row.entity,
            entity_id=row.entity_id,
            action=row.action,
            origin=row.origin,
            before=row.before,
            after=row.after,
            detail=row.detail,
            version=row.version,
        )
        for row in reversed(rows)
    ]
