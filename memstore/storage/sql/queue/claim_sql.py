"""The claim's statements, built once per dialect and shape, run with bound values.

Building a claim's SQLAlchemy expression (a CTE over the queue and its claims, an alias of the
queue, some forty columns) costs more Python than running it costs the database, so each shape
(dialect; ``force``; one owner's rows only; an exclusion list) is built once, with named
parameters (``ClaimParameters``), and SQLAlchemy's compiled cache serves its text after that.

PostgreSQL runs the whole claim as one statement: ``candidate`` (the first scope in fairness
order), ``claimed`` (its claim row, inserted or taken over; a claim row is locked before any
queue row, the order every queue writer keeps) and ``leased`` (its rows, ``FOR UPDATE SKIP
LOCKED``), each reading the one before. SQLite, without data-modifying CTEs, runs the claim's
insert and the lease as two statements in one write transaction.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    String,
    Text,
    all_,
    and_,
    bindparam,
    cast,
    func,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

from memstore.storage.sql.schema.models import claims_table as _claims
from memstore.storage.sql.schema.models import queue_table as _queue

CLAIM_BATCH = 8
"""Rows one claim leases: a scope with a backlog gives the worker back after these, so other
scopes are served in between (round robin, least recently served first)."""
_TIME = _claims.c.claimed_at.type


class Shape(NamedTuple):
    """What changes a claim's SQL, as opposed to its values."""

    dialect: str
    force: bool
    """Pending rows are claimable before they are due (``flush``)."""
    by_owner: bool
    """Only the rows one process queued (``flush``)."""
    excluding: bool
    """Not the rows ``flush`` has already run."""


class ClaimStatements(NamedTuple):
    claim: Any
    """PostgreSQL: the whole claim. SQLite: the claim row, returning its scope."""
    lease: Any | None
    """SQLite only: the claimed scope's leases."""


def parameters(
    dialect: str,
    *,
    owner: str,
    token: str,
    now: datetime,
    expires: datetime,
    only_owner: str | None,
    exclude: Sequence[int],
) -> dict[str, Any]:
    """The values a claim's statements are run with."""
    return {
        "b_owner": owner,
        "b_token": token,
        "b_now": now,
        "b_expires": expires,
        "b_only_owner": only_owner,
        "b_exclude": excluded_ids(dialect, exclude),
    }


def excluded_ids(dialect: str, ids: Sequence[int]) -> Any:
    """The value of ``not_excluded``'s one parameter: an array, or JSON on SQLite."""
    return list(ids) if dialect == "postgresql" else json.dumps(list(ids))


def claimable(shape: Shape, table: Any = _queue) -> ColumnElement[bool]:
    """Rows a worker may lease: pending and due (any time with ``force``), or leased and expired."""
    now = bindparam("b_now", type_=_TIME)
    due: ColumnElement[bool] = table.c.state == "pending"
    if not shape.force:
        due = and_(due, table.c.due_at <= now)
    condition = or_(due, and_(table.c.state == "leased", table.c.lease_expires_at < now))
    if shape.by_owner:
        condition = and_(condition, table.c.enqueued_by == bindparam("b_only_owner", type_=String))
    if shape.excluding:
        condition = and_(condition, not_excluded(shape.dialect, table.c.id))
    return condition


def not_excluded(dialect: str, column: ColumnElement[int]) -> ColumnElement[bool]:
    """``column`` not among the excluded ids, bound as one parameter (an array, or JSON on SQLite):
    ``flush`` excludes every row it has run, and one parameter per id made its k-th claim bind k."""
    if dialect == "postgresql":
        return column != all_(bindparam("b_exclude", type_=postgresql.ARRAY(BigInteger)))
    listed = func.json_each(bindparam("b_exclude", type_=String)).table_valued("value")
    return column.not_in(select(listed.c.value).scalar_subquery())


@functools.cache
def statements(shape: Shape) -> ClaimStatements:
    """The claim's statements for ``shape``, built on first use."""
    if shape.dialect == "postgresql":
        candidate = _candidate(shape).cte("candidate")
        claimed = _claim_row(shape, candidate).cte("claimed")
        leased = _lease(shape, claimed).cte("leased")
        counted = select(
            select(func.count()).select_from(candidate).scalar_subquery().label("candidates"),
            select(func.count()).select_from(claimed).scalar_subquery().label("won"),
        ).subquery("counted")
        whole = select(counted.c.candidates, counted.c.won, *leased.c).select_from(
            counted.outerjoin(leased, true())
        )
        return ClaimStatements(whole, None)
    claimed = select(
        bindparam("b_tenant", type_=String).label("tenant_id"),
        bindparam("b_user", type_=String).label("user_id"),
        bindparam("b_agent", type_=String).label("agent_name"),
    ).subquery("claimed")
    return ClaimStatements(_claim_row(shape, _candidate(shape).subquery("candidate")), _lease(shape, claimed))


def _candidate(shape: Shape) -> Any:
    """The scope to claim: least recently served tenant first (its newest claim row), then its
    least recently served scope (a released claim row stays as the scope's last service), then
    the oldest due row, among scopes with a claimable row and no live claim. A backlog is so
    served ``CLAIM_BATCH`` rows at a time, in turn with every other scope and tenant."""
    tenants = (
        select(_claims.c.tenant_id, func.max(_claims.c.claimed_at).label("served"))
        .group_by(_claims.c.tenant_id)
        .subquery()
    )
    served = and_(
        _claims.c.tenant_id == _queue.c.tenant_id,
        _claims.c.user_id == _queue.c.user_id,
        _claims.c.agent_name == _queue.c.agent_name,
    )
    now = bindparam("b_now", type_=_TIME)
    free = or_(_claims.c.lease_expires_at.is_(None), _claims.c.lease_expires_at < now)
    return (
        select(_queue.c.tenant_id, _queue.c.user_id, _queue.c.agent_name)
        .select_from(
            _queue.outerjoin(_claims, served).outerjoin(tenants, tenants.c.tenant_id == _queue.c.tenant_id)
        )
        .where(claimable(shape), free)
        .order_by(tenants.c.served.nulls_first(), _claims.c.claimed_at.nulls_first(), _queue.c.due_at)
        .limit(1)
    )


def _claim_row(shape: Shape, candidate: Any) -> Any:
    """Insert the candidate scope's claim, or take over an expired one: the primary key makes it
    exclusive. Returns the scope when the claim is this statement's."""
    values = {
        "lease_owner": bindparam("b_owner", type_=String),
        "lease_token": bindparam("b_token", type_=String),
        "lease_expires_at": bindparam("b_expires", type_=_TIME),
        "claimed_at": bindparam("b_now", type_=_TIME),
    }
    rows = select(
        candidate.c.tenant_id,
        candidate.c.user_id,
        candidate.c.agent_name,
        *(value.label(name) for name, value in values.items()),
    )
    dialect_insert = postgresql.insert if shape.dialect == "postgresql" else sqlite.insert
    # ``WHERE true``: SQLite's parser needs a WHERE before an upsert's ON CONFLICT.
    insert = dialect_insert(_claims).from_select(
        ["tenant_id", "user_id", "agent_name", *values], rows.where(true())
    )
    return insert.on_conflict_do_update(
        index_elements=[_claims.c.tenant_id, _claims.c.user_id, _claims.c.agent_name],
        set_={name: insert.excluded[name] for name in values},
        where=_claims.c.lease_expires_at < bindparam("b_now", type_=_TIME),
    ).returning(_claims.c.tenant_id, _claims.c.user_id, _claims.c.agent_name)


def _lease(shape: Shape, scope: Any) -> Any:
    """Lease the claimed scope's rows under the claim's token, returning them to decode."""
    rows = _queue.alias("claimable")
    in_scope = and_(
        rows.c.tenant_id == scope.c.tenant_id,
        rows.c.user_id == scope.c.user_id,
        rows.c.agent_name == scope.c.agent_name,
    )
    # Rows another transaction has locked are skipped, never waited for: waiting could deadlock
    # against that transaction's wait for our claim row.
    ids = (
        select(rows.c.id)
        .select_from(rows.join(scope, in_scope))
        .where(claimable(shape, rows))
        .order_by(rows.c.due_at, rows.c.id)
        .limit(CLAIM_BATCH)
        .with_for_update(of=rows, skip_locked=True)
    )
    return (
        update(_queue)
        .where(_queue.c.id.in_(ids.scalar_subquery()))
        .values(
            state="leased",
            lease_owner=bindparam("b_owner", type_=String),
            lease_token=bindparam("b_token", type_=String),
            lease_expires_at=bindparam("b_expires", type_=_TIME),
            attempts=_queue.c.attempts + 1,
        )
        .returning(
            _queue.c.id,
            _queue.c.tenant_id,
            _queue.c.user_id,
            _queue.c.agent_name,
            _queue.c.kind,
            _queue.c.thread_id,
            # As text, decoded by the claimer: a row a driver cannot decode must not fail the claim.
            cast(_queue.c.messages, Text).label("messages"),
            _queue.c.correction_detected,
            _queue.c.reinforcement_detected,
            _queue.c.captured_at,
            _queue.c.generation,
            _queue.c.attempts,
            _queue.c.failures,
            _queue.c.due_at,
        )
    )
