"""The durable update queue's rows: enqueue, and settle what a worker leased.

A conversation is one ``memory_queue`` row per ``(tenant_id, thread_id, user_id, agent_name)``;
enqueueing again replaces its messages and bumps its ``generation``. Claiming is ``claims.py``'s.
A row is written under its own identity (tenant and user: PostgreSQL's policies refuse a row
forged for another), and settled by id and token within its tenant.

Settling a row checks its token and its scope's claim (``fence.py``): a worker whose lease
expired and was taken over matches no row, so it cannot complete, retry or kill what another
worker now owns, nor any other row of the scope. The save that applies a conversation completes
its row in the same transaction (``complete``), which is what makes a conversation claimed twice
land once; the settle of a claim's last row also gives the claim back there. Times are the
workers' UTC clocks: replicas must keep them in sync (NTP) to well within a lease.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    case,
    delete,
    func,
    literal,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

from memstore.scope import DEFAULT_TENANT_ID
from memstore.storage.sql.engine import SQLITE_BUSY_TIMEOUT_OPTION, SQLITE_WRITE_OPTION
from memstore.storage.sql.queue.claim_sql import excluded_ids, not_excluded
from memstore.storage.sql.queue.fence import (
    RELEASED_AGO,
    completions,
    leased_row,
    release_claim,
    settle_parameters,
    unleased,
)
from memstore.storage.sql.queue.limits import NO_ID, QueueLimits, check_bounds, stored_message_chars
from memstore.storage.sql.schema.models import claims_table as _claims
from memstore.storage.sql.schema.models import queue_table as _queue


@dataclass
class QueueLease:
    """A worker's hold on one queued conversation, as the generation it read."""

    row_id: int
    token: str
    generation: int
    settled: bool = False
    """Set by a save that completed the row in its own transaction: no further write is needed."""
    tenant_id: str = DEFAULT_TENANT_ID
    """The row's tenant: settling matches it too, so a lease never reaches another tenant's row."""
    user_id: str = NO_ID
    """The scope's user and agent as the queue stores them (``''`` for none): a settle finds the
    scope's claim by its primary key."""
    agent_name: str = NO_ID
    releases_claim: bool = False
    """Set by the runner on a claim's last row once every earlier row is settled: the settle of
    this row (the save's transaction, or the runner's own) gives the claim back in the same
    transaction, so a conversation costs no separate release."""


@dataclass(frozen=True)
class QueuedConversation:
    """A row as enqueued; ``captured_at`` is when its newest turn was captured."""

    thread_id: str
    user_id: str | None
    agent_name: str | None
    messages: list[dict[str, str]]
    correction_detected: bool
    reinforcement_detected: bool
    captured_at: datetime
    tenant_id: str = DEFAULT_TENANT_ID
    kind: str = "conversation"
    """``conversation`` or ``session_compress`` (``capture.conversation``)."""


@dataclass(frozen=True)
class LeasedConversation:
    conversation: QueuedConversation
    lease: QueueLease
    attempts: int
    """Claims of this row so far, this one included."""
    failures: int
    """Earlier failures that retrying would not fix (``update_max_attempts`` counts these)."""


@dataclass(frozen=True)
class ScopeClaim:
    user_id: str
    agent_name: str
    token: str
    conversations: list[LeasedConversation]
    undecodable: list[tuple[QueueLease, str]] = field(default_factory=list)
    """Rows leased with the claim that hold no conversation, with why: the runner kills them."""
    tenant_id: str = DEFAULT_TENANT_ID


def write_options(busy_timeout_ms: int) -> dict[str, Any]:
    """Execution options for a queue write: SQLite takes its write lock up front, bounded."""
    return {SQLITE_WRITE_OPTION: True, SQLITE_BUSY_TIMEOUT_OPTION: busy_timeout_ms}


def insert_for(conn: Connection) -> Any:
    return postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert


def enqueue(
    conn: Connection,
    item: QueuedConversation,
    *,
    owner: str,
    now: datetime,
    due_at: datetime,
    latest_due_at: datetime,
    limits: QueueLimits | None = None,
    bounds: Connection | None = None,
) -> bool:
    """Insert the conversation, or fold it into its pending row (one statement); ``False`` when a
    newer turn of it is stored already.

    A pending row keeps the earlier of its own and the new ``due_at``, and never moves past the
    ``latest_due_at`` fixed when it first became pending (the starvation cap) nor before a
    retry's ``not_before``. A leased row gets the new messages for its next generation; a done or
    dead row starts afresh. A turn captured before the stored one changes nothing (replicas must
    keep their clocks in sync for this to pick the newest turn). With ``limits``, a write that
    would pass them raises ``QueueFullError`` and stores nothing; they are read on ``bounds``
    (default ``conn``), which must see every tenant's rows.
    """
    chars = stored_message_chars(item.messages)
    if limits is not None:
        check_bounds(bounds or conn, item, chars, limits)
    insert = insert_for(conn)(_queue).values(
        tenant_id=item.tenant_id,
        kind=item.kind,
        thread_id=item.thread_id,
        user_id=item.user_id or NO_ID,
        agent_name=item.agent_name or NO_ID,
        messages=item.messages,
        message_chars=chars,
        correction_detected=item.correction_detected,
        reinforcement_detected=item.reinforcement_detected,
        state="pending",
        generation=1,
        attempts=0,
        captured_at=item.captured_at,
        pending_since=now,
        due_at=min(due_at, latest_due_at),
        latest_due_at=latest_due_at,
        enqueued_by=owner,
        created_at=now,
        updated_at=now,
    )
    new = insert.excluded
    pending = _queue.c.state == "pending"
    settled = _queue.c.state.in_(("done", "dead"))
    debounced = _least(conn)(new.due_at, _queue.c.latest_due_at)
    statement = insert.on_conflict_do_update(
        index_elements=[
            _queue.c.tenant_id,
            _queue.c.kind,
            _queue.c.thread_id,
            _queue.c.user_id,
            _queue.c.agent_name,
        ],
        set_={
            "messages": new.messages,
            "message_chars": new.message_chars,
            # Sticky until processed: a later turn without a correction keeps an earlier one's hint.
            "correction_detected": _sticky(settled, _queue.c.correction_detected, new.correction_detected),
            "reinforcement_detected": _sticky(
                settled, _queue.c.reinforcement_detected, new.reinforcement_detected
            ),
            "generation": _queue.c.generation + 1,
            "state": _case(settled, literal("pending"), _queue.c.state),
            "attempts": _case(settled, literal(0), _queue.c.attempts),
            "failures": _case(settled, literal(0), _queue.c.failures),
            "not_before": _case(settled, null(), _queue.c.not_before),
            "last_error": _case(settled, null(), _queue.c.last_error),
            "completed_at": None,
            "captured_at": new.captured_at,
            "pending_since": _case(pending, _queue.c.pending_since, new.pending_since),
            "latest_due_at": _case(pending, _queue.c.latest_due_at, new.latest_due_at),
            # A retry's backoff holds against new turns: only the conversation's own debounce moves.
            "due_at": _case(
                pending, _greatest(conn)(debounced, func.coalesce(_queue.c.not_before, debounced)), new.due_at
            ),
            "enqueued_by": new.enqueued_by,
            "updated_at": new.updated_at,
        },
        # A write that arrives late (it outlived the request's wait) never replaces a newer turn,
        # and the same turn written twice (late, and again from the buffer) never runs twice.
        where=or_(
            _queue.c.captured_at < new.captured_at,
            and_(_queue.c.captured_at == new.captured_at, pending),
        ),
    )
    return bool(conn.execute(statement).rowcount)


def _case(condition: Any, then: Any, otherwise: Any) -> Any:
    return case((condition, then), else_=otherwise)


def _greatest(conn: Connection) -> Any:
    """SQLite's two-argument ``max`` is PostgreSQL's ``greatest``."""
    return func.max if conn.dialect.name == "sqlite" else func.greatest


def _least(conn: Connection) -> Any:
    return func.min if conn.dialect.name == "sqlite" else func.least


def _sticky(settled: Any, stored: Any, incoming: Any) -> Any:
    return _case(settled, incoming, or_(stored, incoming))


def complete(conn: Connection, lease: QueueLease, *, now: datetime, forget: bool = False) -> bool:
    """Mark the leased row done, or pending again if a newer generation arrived; ``False`` if lost.

    A done row keeps no messages: the conversation's text is not kept past its processing. With
    ``forget`` (its save was refused because the scope was erased or cleared), the row is
    deleted instead, so an erased user's id does not linger in the queue either. The claim's
    last row gives the claim back first (``fence.py``).
    """
    values = settle_parameters(lease, now)
    if lease.releases_claim and not release_claim(conn, values):
        return False
    done, newer = completions(conn.dialect.name, not lease.releases_claim, forget)
    if conn.execute(done, values).rowcount:
        return True
    return bool(conn.execute(newer, values).rowcount)


def reschedule(
    conn: Connection,
    lease: QueueLease,
    *,
    now: datetime,
    due_at: datetime,
    error: str,
    permanent: bool,
    dead: bool,
) -> bool:
    """Put a failed row back for ``due_at`` (or in ``dead``), recording ``error``; ``False`` if lost.

    ``permanent`` failures (not an outage, not a transient endpoint error) are counted in
    ``failures``. A row that got a newer generation meanwhile is never killed: the new turn gets
    its chance.
    """
    parameters = settle_parameters(lease, now)
    if lease.releases_claim and not release_claim(conn, parameters):
        return False
    mine = leased_row(conn.dialect.name, not lease.releases_claim)
    same = _queue.c.generation == lease.generation
    values: dict[str, Any] = {"last_error": error[:4000], **unleased(now)}
    if permanent:
        values["failures"] = _queue.c.failures + 1
    if dead:
        killed = update(_queue).where(mine, same).values(state="dead", **values)
        if conn.execute(killed, parameters).rowcount:
            return True
        values["failures"] = 0
        return bool(
            conn.execute(update(_queue).where(mine).values(state="pending", **values), parameters).rowcount
        )
    later = _greatest(conn)(_queue.c.due_at, due_at)
    # ``not_before`` holds the backoff against new turns (a stream of turns must not turn a
    # failing conversation into a tight retry loop, nor cut a Retry-After short).
    retry = update(_queue).where(mine).values(state="pending", due_at=later, not_before=due_at, **values)
    return bool(conn.execute(retry, parameters).rowcount)


def release(conn: Connection, token: str, *, now: datetime) -> int:
    """Give back a claim and any row still leased under it (shutdown); returns the rows released.

    The claim goes first: heartbeats and settles lock claims before rows, and so does this (a
    claim, which locks a queue row first, waits for neither). The release does not count as an
    attempt. While the scope has rows left, its claim row stays, expired and under a token nobody
    holds, as the scope's last service (claims serve the scope that has waited longest since its
    last service first); a scope with nothing queued keeps no row, and so no user id.
    """
    orphan = uuid.uuid4().hex
    scope = conn.execute(
        update(_claims)
        .where(_claims.c.lease_token == token)
        .values(lease_token=orphan, lease_owner="", lease_expires_at=now - RELEASED_AGO)
        .returning(_claims.c.tenant_id, _claims.c.user_id, _claims.c.agent_name)
    ).first()
    if scope is not None:
        left = (
            select(_queue.c.id)
            .where(
                _queue.c.tenant_id == scope.tenant_id,
                _queue.c.user_id == scope.user_id,
                _queue.c.agent_name == scope.agent_name,
                _queue.c.state.in_(("pending", "leased")),
            )
            .exists()
        )
        conn.execute(delete(_claims).where(_claims.c.lease_token == orphan, ~left))
    released = conn.execute(
        update(_queue)
        .where(_queue.c.lease_token == token, _queue.c.state == "leased")
        .values(state="pending", attempts=_greatest(conn)(_queue.c.attempts - 1, 0), **unleased(now))
    ).rowcount
    return int(released)


def clear_pending(conn: Connection, *, owner: str) -> int:
    """Delete ``owner``'s pending rows (``clear``); leased rows are running and stay."""
    return int(
        conn.execute(
            delete(_queue).where(_queue.c.enqueued_by == owner, _queue.c.state == "pending")
        ).rowcount
    )


def make_due(conn: Connection, *, owner: str, now: datetime) -> int:
    """Make ``owner``'s pending rows due now (``flush_nowait``)."""
    return int(
        conn.execute(
            update(_queue)
            .where(_queue.c.enqueued_by == owner, _queue.c.state == "pending", _queue.c.due_at > now)
            .values(due_at=now)
        ).rowcount
    )


def unsettled(conn: Connection, *, owner: str | None = None, exclude: Sequence[int] = ()) -> int:
    """Conversations pending or leased (of ``owner``, or of every process), but ``exclude``."""
    dialect = conn.dialect.name
    condition: ColumnElement[bool] = _queue.c.state.in_(("pending", "leased"))
    if owner is not None:
        condition = and_(condition, _queue.c.enqueued_by == owner)
    if exclude:
        condition = and_(condition, not_excluded(dialect, _queue.c.id))
    counted = select(func.count()).select_from(_queue).where(condition)
    return int(conn.execute(counted, {"b_exclude": excluded_ids(dialect, exclude)}).scalar_one())
