"""Claiming work from the durable queue: one scope per worker, enforced by the database.

A scope is ``(tenant_id, user_id, agent_name)``. A claim takes a whole scope in
``memory_queue_claims`` (an INSERT, or the take-over of an expired claim, exclusive by the
primary key) and leases up to ``CLAIM_BATCH`` (8) of the scope's claimable rows under the claim's
token, skipping rows another transaction holds (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite
serialises writers). On PostgreSQL that is one statement (``WITH candidate, claimed, leased``),
run as its own transaction; on SQLite two, in one write transaction. A heartbeat extends the
claim and its rows. A claim leaves the scope's other leases alone: a worker that lost its claim
cannot settle them, because every settle also checks the claim (``fence.py``). Lock order,
everywhere: claims before queue rows.

Claims cross tenants, so they run on the operator connection. Fairness is two-level: the tenant
served least recently goes first (its last service is its newest claim row), then its scope
served least recently, so one tenant's backlog of many scopes cannot starve another tenant.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import Connection, bindparam, delete, select, update

from memstore.document import as_utc
from memstore.storage.sql.queue.claim_sql import Shape, claimable, parameters, statements
from memstore.storage.sql.queue.table import (
    LeasedConversation,
    QueuedConversation,
    QueueLease,
    ScopeClaim,
)
from memstore.storage.sql.schema.models import claims_table as _claims
from memstore.storage.sql.schema.models import queue_table as _queue

MAX_MESSAGES_TEXT = 1_000_000
"""A row's ``messages`` JSON beyond this is not one enqueue wrote (it keeps 64,000 characters)."""
CLAIM_CANDIDATES = 16
"""Attempts a claim makes before giving up: enough to get past scopes claimed meanwhile."""


def _held() -> Any:
    """The row's scope is claimed by a live worker."""
    return (
        select(_claims.c.user_id)
        .where(
            _claims.c.tenant_id == _queue.c.tenant_id,
            _claims.c.user_id == _queue.c.user_id,
            _claims.c.agent_name == _queue.c.agent_name,
            _claims.c.lease_expires_at >= bindparam("b_now", type_=_claims.c.lease_expires_at.type),
        )
        .exists()
    )


@functools.cache
def _probe(shape: Shape) -> Any:
    return select(_queue.c.id).where(claimable(shape), ~_held()).limit(1)


def has_claimable(
    conn: Connection,
    now: datetime,
    *,
    force: bool = False,
    owner: str | None = None,
    exclude: Sequence[int] = (),
) -> bool:
    """The cheap read an idle SQLite worker makes before it opens a write transaction to claim."""
    shape = Shape(conn.dialect.name, force, owner is not None, bool(exclude))
    values = parameters(
        shape.dialect, owner="", token="", now=now, expires=now, only_owner=owner, exclude=exclude
    )
    return conn.execute(_probe(shape), values).first() is not None


class _Attempt(NamedTuple):
    candidates: int
    """Scopes with claimable rows and no live claim (0 or 1: an attempt looks at the first)."""
    won: bool
    """The claim row is this attempt's (it may still have leased nothing: rows locked meanwhile)."""
    rows: list[Any]


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
    """Claim the first scope in fairness order with claimable rows and lease up to 8 of them.

    PostgreSQL: one statement, which is its own transaction on an autocommit connection; SQLite:
    two statements in the caller's write transaction, which serialises claimers. A PostgreSQL
    claim that loses its scope to a concurrent claimer, or finds its rows locked (an enqueue
    writing them), tries again, at most ``CLAIM_CANDIDATES`` times.
    """
    shape = Shape(conn.dialect.name, force, only_owner is not None, bool(exclude))
    expires = now + timedelta(seconds=lease_seconds)
    for _ in range(CLAIM_CANDIDATES):
        token = uuid.uuid4().hex
        values = parameters(
            shape.dialect,
            owner=owner,
            token=token,
            now=now,
            expires=expires,
            only_owner=only_owner,
            exclude=exclude,
        )
        attempt = _attempt(conn, shape, values)
        if not attempt.candidates:
            return None
        if attempt.rows:
            return _scope_claim(attempt.rows, token)
        if attempt.won:  # nothing leased under it: give the scope back at once
            conn.execute(delete(_claims).where(_claims.c.lease_token == token))
    return None


def _attempt(conn: Connection, shape: Shape, values: dict[str, Any]) -> _Attempt:
    sql = statements(shape)
    if sql.lease is None:  # PostgreSQL: the whole claim in one statement
        result = conn.execute(sql.claim, values).all()
        first = result[0]
        leased = [row for row in result if row.id is not None]
        return _Attempt(int(first.candidates), bool(first.won), leased)
    # SQLite serialises claimers: a candidate is always won, and always has rows to lease.
    scope = conn.execute(sql.claim, values).first()
    if scope is None:
        return _Attempt(0, False, [])
    scoped = {**values, "b_tenant": scope.tenant_id, "b_user": scope.user_id, "b_agent": scope.agent_name}
    return _Attempt(1, True, list(conn.execute(sql.lease, scoped).all()))


def _scope_claim(rows: list[Any], token: str) -> ScopeClaim:
    """The leased rows as the runner takes them: the conversations, and the rows that do not decode."""
    leased: list[LeasedConversation] = []
    undecodable: list[tuple[QueueLease, str]] = []
    first = rows[0]
    for row in sorted(rows, key=lambda row: (row.due_at, row.id)):
        lease = QueueLease(
            row.id,
            token,
            row.generation,
            tenant_id=row.tenant_id,
            user_id=row.user_id,
            agent_name=row.agent_name,
        )
        try:
            conversation = QueuedConversation(
                thread_id=row.thread_id,
                user_id=row.user_id or None,
                agent_name=row.agent_name or None,
                messages=decode_messages(row.messages),
                correction_detected=bool(row.correction_detected),
                reinforcement_detected=bool(row.reinforcement_detected),
                captured_at=as_utc(row.captured_at),
                tenant_id=row.tenant_id,
                kind=row.kind,
            )
        except Exception as exc:  # RecursionError included: no row may fail the claim
            undecodable.append((lease, str(exc) or type(exc).__name__))
            continue
        leased.append(LeasedConversation(conversation, lease, row.attempts, row.failures))
    return ScopeClaim(first.user_id, first.agent_name, token, leased, undecodable, tenant_id=first.tenant_id)


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
