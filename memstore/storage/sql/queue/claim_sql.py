"""The claim's statements, built once per dialect and shape, run with bound values.

Building a claim's SQLAlchemy expression (a CTE over the queue and its claims, an alias of the
queue, some forty columns) costs more Python than running it costs the database, so each shape
(dialect; ``force``; one owner's rows only; an exclusion list) is built once, with named
parameters (``ClaimParameters``), and SQLAlchemy's compiled cache serves its text after that.

PostgreSQL runs the whole claim as one statement: ``candidate`` (the first scope in fairness
order whose queue row it can lock, ``FOR UPDATE SKIP LOCKED``: a scope whose rows another
transaction holds is passed over, never waited for), ``locked`` (the scope's claim row, if it has
one, ``FOR UPDATE SKIP LOCKED`` too), ``claimed`` (the claim row, inserted or taken over, only
when it is not another transaction's) and ``leased`` (its rows, ``FOR UPDATE SKIP LOCKED``), each
reading the one before. The candidate's queue row is locked before its claim row, against the
order every other queue writer keeps (claims, then queue rows), which is why nothing after it
waits: a claim row held elsewhere makes the attempt lose, and the next attempt passes the scope
over (``tried``). SQLite, without data-modifying CTEs, runs the claim's insert and the lease as
two statements in one write transaction.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    LargeBinary,
    String,
    Text,
    all_,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

from memstore.storage.sql.schema.models import claims_table as _claims
from memstore.storage.sql.schema.models import queue_table as _queue

CLAIM_BATCH = 8
"""Rows one claim leases: a scope with a backlog gives the worker back after these, so other
scopes are served in between (what fell due before the backlog's last service, ``_candidate``)."""
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
    skipping: bool = False
    """PostgreSQL: not the scopes this claim already tried (their claim row was held elsewhere)."""


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
    tried: Sequence[tuple[str, str, str]] = (),
) -> dict[str, Any]:
    """The values a claim's statements are run with."""
    return {
        "b_owner": owner,
        "b_token": token,
        "b_now": now,
        "b_expires": expires,
        "b_only_owner": only_owner,
        "b_exclude": excluded_ids(dialect, exclude),
        "b_tried_tenants": [scope[0] for scope in tried],
        "b_tried_users": [scope[1] for scope in tried],
        "b_tried_agents": [scope[2] for scope in tried],
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
            *(
                select(candidate.c[name]).scalar_subquery().label(f"scope_{name}")
                for name in ("tenant_id", "user_id", "agent_name")
            ),
            select(func.count()).select_from(claimed).scalar_subquery().label("won"),
        ).subquery("counted")
        whole = select(*counted.c, *leased.c).select_from(counted.outerjoin(leased, true()))
        return ClaimStatements(whole, None)
    claimed = select(
        bindparam("b_tenant", type_=String).label("tenant_id"),
        bindparam("b_user", type_=String).label("user_id"),
        bindparam("b_agent", type_=String).label("agent_name"),
    ).subquery("claimed")
    return ClaimStatements(_claim_row(shape, _candidate(shape).subquery("candidate")), _lease(shape, claimed))


def _waited(served: Any, due: Any) -> Any:
    """How long a row has been waiting for its tenant or scope: since the later of the last
    service (``served``, NULL when none is on record) and the row's ``due_at``. A ``CASE``, as
    SQLite's two-argument ``max`` is NULL on a NULL argument."""
    return case((served > due, served), else_=due)


def _candidate(shape: Shape) -> Any:
    """The scope to claim, among scopes with a claimable row and no live claim: the tenant that
    has waited longest first, then its scope that has waited longest, then the oldest due row.

    A tenant has waited since the later of its last service (its newest claim row's
    ``claimed_at``) and the ``due_at`` of its oldest claimable row; a scope likewise, with its
    own claim row (a released claim stays as the scope's last service while the scope has rows
    left; a scope with nothing queued keeps no row). Ordering the rows by
    ``greatest(served, due_at)`` at each level is that order. A scope's wait only starts again
    when it is served, so a conversation that became due after a backlog was last served waits
    behind the backlog: a backlog is served ``CLAIM_BATCH`` rows at a time, in turn with the
    conversations due before its last service, and no stream of new users or tenants starves it.

    PostgreSQL locks the candidate's queue row ``FOR UPDATE SKIP LOCKED`` (the queue only; the
    claims are outer-joined), so a scope whose rows another transaction holds (an erase, a flush,
    an operator's retry) is passed over for the next in order, in the same statement.
    """
    tenants = (
        select(_claims.c.tenant_id, func.max(_claims.c.claimed_at).label("served"))
        .group_by(_claims.c.tenant_id)
        .subquery("tenants")
    )
    served = and_(
        _claims.c.tenant_id == _queue.c.tenant_id,
        _claims.c.user_id == _queue.c.user_id,
        _claims.c.agent_name == _queue.c.agent_name,
    )
    now = bindparam("b_now", type_=_TIME)
    free = or_(_claims.c.lease_expires_at.is_(None), _claims.c.lease_expires_at < now)
    condition = and_(claimable(shape), free)
    if shape.skipping:
        condition = and_(condition, _untried())
    query = (
        select(
            _queue.c.tenant_id,
            _queue.c.user_id,
            _queue.c.agent_name,
            _claims.c.claimed_at.label("served"),
        )
        .select_from(
            _queue.outerjoin(_claims, served).outerjoin(tenants, tenants.c.tenant_id == _queue.c.tenant_id)
        )
        .where(condition)
        .order_by(
            _waited(tenants.c.served, _queue.c.due_at),
            _waited(_claims.c.claimed_at, _queue.c.due_at),
            _queue.c.due_at,
            _queue.c.id,
        )
        .limit(1)
    )
    if shape.dialect == "postgresql":
        query = query.with_for_update(of=_queue, skip_locked=True)
    return query


def _untried() -> ColumnElement[bool]:
    """PostgreSQL: the row's scope is none of those this claim has tried (three parallel arrays)."""
    tried = (
        func.unnest(
            bindparam("b_tried_tenants", type_=postgresql.ARRAY(String)),
            bindparam("b_tried_users", type_=postgresql.ARRAY(String)),
            bindparam("b_tried_agents", type_=postgresql.ARRAY(String)),
        )
        .table_valued("tenant_id", "user_id", "agent_name")
        .render_derived(name="tried")
    )
    scope = tuple_(_queue.c.tenant_id, _queue.c.user_id, _queue.c.agent_name)
    return scope.not_in(select(tried.c.tenant_id, tried.c.user_id, tried.c.agent_name))


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
    if shape.dialect == "postgresql":
        # The scope's claim row, when it has one, is locked first, skipped if another transaction
        # holds it (a heartbeat, a settle, an erase): the upsert then never waits for it while the
        # candidate's queue row is locked, and no claim is taken from under its holder.
        locked = (
            select(_claims.c.tenant_id)
            .where(
                _claims.c.tenant_id == candidate.c.tenant_id,
                _claims.c.user_id == candidate.c.user_id,
                _claims.c.agent_name == candidate.c.agent_name,
            )
            .with_for_update(of=_claims, skip_locked=True)
            .cte("locked")
        )
        rows = rows.where(or_(candidate.c.served.is_(None), exists(select(locked.c.tenant_id))))
    else:
        # ``WHERE true``: SQLite's parser needs a WHERE before an upsert's ON CONFLICT.
        rows = rows.where(true())
    dialect_insert = postgresql.insert if shape.dialect == "postgresql" else sqlite.insert
    insert = dialect_insert(_claims).from_select(["tenant_id", "user_id", "agent_name", *values], rows)
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
    # Text and times go to the claimer as they are stored, to be decoded per row (``claims.py``):
    # a row a driver cannot decode (not UTF-8 on SQLite, an infinite time on PostgreSQL) would
    # fail the whole claim, and every claim after it.
    if shape.dialect == "postgresql":
        thread_id: Any = _queue.c.thread_id
        messages: Any = cast(_queue.c.messages, Text)
        captured_at: Any = _finite(_queue.c.captured_at)
        due_at: Any = _finite(_queue.c.due_at)
    else:
        thread_id, messages, captured_at, due_at = (
            cast(column, LargeBinary)
            for column in (_queue.c.thread_id, _queue.c.messages, _queue.c.captured_at, _queue.c.due_at)
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
            thread_id.label("thread_id"),
            messages.label("messages"),
            _queue.c.correction_detected,
            _queue.c.reinforcement_detected,
            captured_at.label("captured_at"),
            _queue.c.generation,
            _queue.c.attempts,
            _queue.c.failures,
            due_at.label("due_at"),
        )
    )


def _finite(column: Any) -> Any:
    """PostgreSQL: the time, or NULL for ``infinity``, which the driver cannot load."""
    return case((func.isfinite(column), column))
