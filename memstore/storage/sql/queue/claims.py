"""Claiming work from the durable queue: one scope per worker, enforced by the database.

A scope is ``(tenant_id, user_id, agent_name)``. A worker first claims a whole scope in
``memory_queue_claims`` (an INSERT, or the take-over of an expired claim, in one statement the
primary key makes exclusive), voids every other lease in that scope, then leases the scope's due
rows under the claim's token, skipping rows another transaction holds (``FOR UPDATE SKIP
LOCKED`` on PostgreSQL; SQLite serialises writers). A heartbeat extends the claim and its rows.
Lock order, everywhere: claims before queue rows.

Claims cross tenants, so they run on the operator connection. Fairness is two-level: the tenant
served least recently goes first (its last service is its newest claim row), then its scope
served least recently, so one tenant's backlog of many scopes cannot starve another tenant.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    Text,
    and_,
    cast,
    delete,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from memstore.document import as_utc
from memstore.storage.sql.queue.table import (
    LeasedConversation,
    QueuedConversation,
    QueueLease,
    ScopeClaim,
    insert_for,
    not_among,
    unleased,
)
from memstore.storage.sql.schema.models import claims_table as _claims
from memstore.storage.sql.schema.models import queue_table as _queue

MAX_MESSAGES_TEXT = 1_000_000
"""A row's ``messages`` JSON beyond this is not one enqueue wrote (it keeps 64,000 characters)."""
CLAIM_BATCH = 8
"""Rows one claim leases: a scope with a backlog gives the worker back after these, so other
scopes are served in between (round robin, least recently served first)."""
CLAIM_CANDIDATES = 16
"""Scopes a claim looks at before giving up: enough to get past scopes claimed meanwhile."""


def claimable(
    conn: Connection, now: datetime, *, force: bool, owner: str | None, exclude: Sequence[int] = ()
) -> Any:
    """Rows a worker may lease: pending and due (any time with ``force``), or leased and expired."""
    due = _queue.c.state == "pending"
    if not force:
        due = and_(due, _queue.c.due_at <= now)
    expired = and_(_queue.c.state == "leased", _queue.c.lease_expires_at < now)
    condition = or_(due, expired)
    if owner is not None:
        condition = and_(condition, _queue.c.enqueued_by == owner)
    if exclude:
        condition = and_(condition, not_among(conn, _queue.c.id, exclude))
    return condition


def _held(now: datetime) -> Any:
    """The row's scope is claimed by a live worker."""
    return (
        select(_claims.c.user_id)
        .where(
            _claims.c.tenant_id == _queue.c.tenant_id,
            _claims.c.user_id == _queue.c.user_id,
            _claims.c.agent_name == _queue.c.agent_name,
            _claims.c.lease_expires_at >= now,
        )
        .exists()
    )


def has_claimable(
    conn: Connection,
    now: datetime,
    *,
    force: bool = False,
    owner: str | None = None,
    exclude: Sequence[int] = (),
) -> bool:
    """The cheap read made before a write transaction is opened to claim."""
    condition = claimable(conn, now, force=force, owner=owner, exclude=exclude)
    return conn.execute(select(_queue.c.id).where(condition, ~_held(now)).limit(1)).first() is not None


class QueueScope(NamedTuple):
    """A claimable scope as the queue stores it (``''`` for no user or agent)."""

    tenant_id: str
    user_id: str
    agent_name: str

    def rows(self, table: Any) -> ColumnElement[bool]:
        """``table``'s rows of this scope (the queue's or the claims')."""
        return and_(
            table.c.tenant_id == self.tenant_id,
            table.c.user_id == self.user_id,
            table.c.agent_name == self.agent_name,
        )


def claim(
    conn: Connection,
    *,
    owner: str,
    now: datetime,
    lease_seconds: float,
    force: bool = False,
    only_owner: str | None = None,
    exclude: Sequence[int] = (),
) -> ScopeClaim | None:
    """Claim one scope with claimable rows and lease them; run inside the caller's transaction."""
    condition = claimable(conn, now, force=force, owner=only_owner, exclude=exclude)
    # Least recently served tenant first (its newest claim row), then its least recently served
    # scope (a released claim row stays as the scope's last service), then the oldest due row: a
    # backlog is served CLAIM_BATCH rows at a time, in turn with every other scope and tenant.
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
    candidates = conn.execute(
        select(_queue.c.tenant_id, _queue.c.user_id, _queue.c.agent_name)
        .select_from(
            _queue.outerjoin(_claims, served).outerjoin(tenants, tenants.c.tenant_id == _queue.c.tenant_id)
        )
        .where(condition, or_(_claims.c.lease_expires_at.is_(None), _claims.c.lease_expires_at < now))
        .order_by(tenants.c.served.nulls_first(), _claims.c.claimed_at.nulls_first(), _queue.c.due_at)
        .limit(CLAIM_CANDIDATES)
    ).all()
    expires = now + timedelta(seconds=lease_seconds)
    seen: set[QueueScope] = set()
    for tenant_id, user_id, agent_name in candidates:
        scope = QueueScope(tenant_id, user_id, agent_name)
        if scope in seen:
            continue
        seen.add(scope)
        token = uuid.uuid4().hex
        if not _claim_scope(conn, scope, owner=owner, token=token, now=now, expires=expires):
            continue
        _revoke_other_leases(conn, scope, token=token, now=now)
        leased, undecodable = _lease_rows(conn, scope, condition, owner=owner, token=token, expires=expires)
        if leased or undecodable:
            return ScopeClaim(user_id, agent_name, token, leased, undecodable, tenant_id=tenant_id)
        conn.execute(delete(_claims).where(_claims.c.lease_token == token))
    return None


def _claim_scope(
    conn: Connection,
    scope: QueueScope,
    *,
    owner: str,
    token: str,
    now: datetime,
    expires: datetime,
) -> bool:
    """Insert the scope's claim, or take over an expired one; ``False`` while another worker holds it."""
    insert = insert_for(conn)(_claims).values(
        tenant_id=scope.tenant_id,
        user_id=scope.user_id,
        agent_name=scope.agent_name,
        lease_owner=owner,
        lease_token=token,
        lease_expires_at=expires,
        claimed_at=now,
    )
    statement = insert.on_conflict_do_update(
        index_elements=[_claims.c.tenant_id, _claims.c.user_id, _claims.c.agent_name],
        set_={
            "lease_owner": insert.excluded.lease_owner,
            "lease_token": insert.excluded.lease_token,
            "lease_expires_at": insert.excluded.lease_expires_at,
            "claimed_at": insert.excluded.claimed_at,
        },
        where=_claims.c.lease_expires_at < now,
    ).returning(_claims.c.lease_token)
    return conn.execute(statement).scalar_one_or_none() == token


def _revoke_other_leases(conn: Connection, scope: QueueScope, *, token: str, now: datetime) -> None:
    """A claim on a scope voids every other lease in it: a worker that lost its claim to expiry
    cannot commit any row of the scope, including rows this claim does not take (``flush``)."""
    conn.execute(
        update(_queue)
        .where(
            scope.rows(_queue),
            _queue.c.state == "leased",
            _queue.c.lease_token != token,
        )
        .values(state="pending", **unleased(now))
    )


def _lease_rows(
    conn: Connection,
    scope: QueueScope,
    condition: Any,
    *,
    owner: str,
    token: str,
    expires: datetime,
) -> tuple[list[LeasedConversation], list[tuple[QueueLease, str]]]:
    """Lease the scope's rows under ``token``: the conversations, and the rows that do not decode."""
    # Rows another claimer has locked are skipped, never waited for: waiting could deadlock
    # against that claimer's wait for our claim row.
    ids = (
        select(_queue.c.id)
        .where(condition, scope.rows(_queue))
        .order_by(_queue.c.due_at, _queue.c.id)
        .limit(CLAIM_BATCH)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    rows = conn.execute(
        update(_queue)
        .where(_queue.c.id.in_(ids))
        .values(
            state="leased",
            lease_owner=owner,
            lease_token=token,
            lease_expires_at=expires,
            attempts=_queue.c.attempts + 1,
        )
        .returning(
            _queue.c.id,
            _queue.c.kind,
            _queue.c.thread_id,
            # As text, decoded here: a row a driver cannot decode must not fail the whole claim.
            cast(_queue.c.messages, Text).label("messages"),
            _queue.c.correction_detected,
            _queue.c.reinforcement_detected,
            _queue.c.captured_at,
            _queue.c.generation,
            _queue.c.attempts,
            _queue.c.failures,
            _queue.c.due_at,
        )
    ).all()
    leased: list[LeasedConversation] = []
    undecodable: list[tuple[QueueLease, str]] = []
    for row in sorted(rows, key=lambda row: (row.due_at, row.id)):
        lease = QueueLease(row.id, token, row.generation, tenant_id=scope.tenant_id)
        try:
            conversation = QueuedConversation(
                thread_id=row.thread_id,
                user_id=scope.user_id or None,
                agent_name=scope.agent_name or None,
                messages=decode_messages(row.messages),
                correction_detected=bool(row.correction_detected),
                reinforcement_detected=bool(row.reinforcement_detected),
                captured_at=as_utc(row.captured_at),
                tenant_id=scope.tenant_id,
                kind=row.kind,
            )
        except Exception as exc:  # RecursionError included: no row may fail the claim
            undecodable.append((lease, str(exc) or type(exc).__name__))
            continue
        leased.append(LeasedConversation(conversation, lease, row.attempts, row.failures))
    return leased, undecodable


def decode_messages(raw: str | None) -> list[dict[str, str]]:
    """A row's ``messages`` as enqueue wrote them (a list of ``{"role", "content"}`` strings), or
    ``ValueError`` saying what is wrong: a row a DBA or an older version wrote must be told apart
    from a conversation, never crash the worker that claimed it."""
    if raw is None:
        raise ValueError("messages is NULL")
    if len(raw) > MAX_MESSAGES_TEXT:
        raise ValueError(f"messages is {len(raw):,} characters of JSON, over {MAX_MESSAGES_TEXT:,}")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"messages is not JSON enqueue could have written: {type(exc).__name__}") from None
    if not isinstance(value, list):
        raise ValueError(f"messages is a JSON {type(value).__name__}, not a list")
    messages: list[dict[str, str]] = []
    for index, message in enumerate(value):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{index}] is a {type(message).__name__}, not an object")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise ValueError(f"messages[{index}] needs string role and content")
        messages.append({"role": role, "content": content})
    return messages


def heartbeat(conn: Connection, tokens: Sequence[str], *, now: datetime, lease_seconds: float) -> set[str]:
    """Extend the claims and row leases of ``tokens``; returns the tokens whose claim still exists."""
    expires = now + timedelta(seconds=lease_seconds)
    alive = set(
        conn.execute(
            update(_claims)
            .where(_claims.c.lease_token.in_(list(tokens)))
            .values(lease_expires_at=expires)
            .returning(_claims.c.lease_token)
        ).scalars()
    )
    if alive:
        conn.execute(
            update(_queue)
            .where(_queue.c.lease_token.in_(list(alive)), _queue.c.state == "leased")
            .values(lease_expires_at=expires)
        )
    return alive
