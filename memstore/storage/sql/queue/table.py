"""The durable update queue's rows: enqueue, and settle what a worker leased.

A conversation is one ``memory_queue`` row per ``(thread_id, user_id, agent_name)``; enqueueing
again replaces its messages and bumps its ``generation``. Claiming is ``queue_claims``'.

Settling a row checks its token: a worker whose lease expired and was taken over matches no
row, so it cannot complete, retry or kill what another worker now owns. The save that applies
a conversation completes its row in the same transaction (``complete``), which is what makes a
conversation claimed twice land once. Times are the workers' UTC clocks: replicas must keep
them in sync (NTP) to well within a lease.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    all_,
    and_,
    bindparam,
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

from memstore.errors import QueueFullError
from memstore.storage.sql.engine import SQLITE_BUSY_TIMEOUT_OPTION, SQLITE_WRITE_OPTION
from memstore.storage.sql.schema.models import claims_table as _claims
from memstore.storage.sql.schema.models import queue_table as _queue

RELEASED_AGO = timedelta(seconds=1)
"""A released claim's lease ends this long before the release, so it is expired at once."""
NO_ID = ""
"""``user_id`` / ``agent_name`` of a queued conversation without one ('' is never a valid id)."""


@dataclass
class QueueLease:
    """A worker's hold on one queued conversation, as the generation it read."""

    row_id: int
    token: str
    generation: int
    settled: bool = False
    """Set by a save that completed the row in its own transaction: no further write is needed."""


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


HELD = _queue.c.state.in_(("pending", "leased", "dead"))
"""Rows that hold messages and count against the bounds: a dead row keeps its conversation until
an operator retries or purges it, so a user whose turns keep failing cannot grow the table either."""


@dataclass(frozen=True)
class QueueLimits:
    """What the table may hold in rows that keep messages (``HELD``), in total and per user.

    A correction may use ``*_depth_corrections`` instead (the reserve). Checked by each write
    before its upsert, so concurrent writers on PostgreSQL can overshoot by one row each.
    """

    depth: int
    depth_corrections: int
    chars: int
    user_depth: int
    user_depth_corrections: int
    user_chars: int


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


def write_options(busy_timeout_ms: int) -> dict[str, Any]:
    """Execution options for a queue write: SQLite takes its write lock up front, bounded."""
    return {SQLITE_WRITE_OPTION: True, SQLITE_BUSY_TIMEOUT_OPTION: busy_timeout_ms}


def insert_for(conn: Connection) -> Any:
    return postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert


MESSAGE_CHARS_OVERHEAD = 24
"""What ``message_chars`` adds per message for its keys and role, as the JSON stores them: a
conversation of many short messages costs what it takes on disk, not only its text."""


def stored_message_chars(messages: Sequence[dict[str, str]]) -> int:
    """A queued conversation's ``message_chars``: its text plus ``MESSAGE_CHARS_OVERHEAD`` a message."""
    return sum(len(message.get("content", "")) + MESSAGE_CHARS_OVERHEAD for message in messages)


def check_bounds(conn: Connection, item: QueuedConversation, chars: int, limits: QueueLimits) -> None:
    """Raise ``QueueFullError`` if storing ``item`` would pass ``limits``; one read over indexes.

    Replacing a held row of the same conversation adds no row, only its growth in characters.
    """
    user = _queue.c.user_id == (item.user_id or NO_ID)
    same = and_(
        _queue.c.thread_id == item.thread_id,
        user,
        _queue.c.agent_name == (item.agent_name or NO_ID),
        HELD,
    )

    def usage(condition: ColumnElement[bool]) -> list[Any]:
        count = select(func.count()).where(condition)
        chars = select(func.coalesce(func.sum(_queue.c.message_chars), 0)).where(condition)
        return [count.scalar_subquery(), chars.scalar_subquery()]

    held = select(_queue.c.message_chars).where(same).scalar_subquery()
    row = conn.execute(select(*usage(HELD), *usage(and_(HELD, user)), held)).one()
    total_rows, total_chars, user_rows, user_chars, stored = (int(value or 0) for value in row)
    replacing = row[4] is not None
    growth = chars - stored
    correction = item.correction_detected
    if not replacing:
        depth = limits.depth_corrections if correction else limits.depth
        if total_rows >= depth:
            raise QueueFullError(f"the queue holds {total_rows} conversations, its limit", kind="full")
        user_depth = limits.user_depth_corrections if correction else limits.user_depth
        if user_rows >= user_depth:
            raise QueueFullError(
                f"the user holds {user_rows} queued conversations, their share", kind="user_share"
            )
    if growth > 0 and total_chars + growth > limits.chars:
        raise QueueFullError(f"the queue holds {total_chars} characters of {limits.chars}", kind="full")
    if growth > 0 and user_chars + growth > limits.user_chars:
        raise QueueFullError(
            f"the user holds {user_chars} queued characters of their share {limits.user_chars}",
            kind="user_share",
        )


def enqueue(
    conn: Connection,
    item: QueuedConversation,
    *,
    owner: str,
    now: datetime,
    due_at: datetime,
    latest_due_at: datetime,
    limits: QueueLimits | None = None,
) -> bool:
    """Insert the conversation, or fold it into its pending row (one statement); ``False`` when a
    newer turn of it is stored already.

    A pending row keeps the earlier of its own and the new ``due_at``, and never moves past the
    ``latest_due_at`` fixed when it first became pending (the starvation cap) nor before a
    retry's ``not_before``. A leased row gets the new messages for its next generation; a done or
    dead row starts afresh. A turn captured before the stored one changes nothing (replicas must
    keep their clocks in sync for this to pick the newest turn). With ``limits``, a write that
    would pass them raises ``QueueFullError`` and stores nothing.
    """
    chars = stored_message_chars(item.messages)
    if limits is not None:
        check_bounds(conn, item, chars, limits)
    insert = insert_for(conn)(_queue).values(
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
        index_elements=[_queue.c.thread_id, _queue.c.user_id, _queue.c.agent_name],
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
    deleted instead, so an erased user's id does not linger in the queue either.
    """
    mine = and_(_queue.c.id == lease.row_id, _queue.c.lease_token == lease.token, _queue.c.state == "leased")
    this_generation = and_(mine, _queue.c.generation == lease.generation)
    if forget:
        done = conn.execute(delete(_queue).where(this_generation)).rowcount
    else:
        done = conn.execute(
            update(_queue)
            .where(this_generation)
            .values(
                state="done",
                messages=[],
                message_chars=0,
                completed_at=now,
                last_error=None,
                failures=0,
                not_before=None,
                **unleased(now),
            )
        ).rowcount
    if done:
        return True
    newer = conn.execute(update(_queue).where(mine).values(state="pending", attempts=0, **unleased(now)))
    return bool(newer.rowcount)


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
    mine = and_(_queue.c.id == lease.row_id, _queue.c.lease_token == lease.token, _queue.c.state == "leased")
    same = _queue.c.generation == lease.generation
    values: dict[str, Any] = {"last_error": error[:4000], **unleased(now)}
    if permanent:
        values["failures"] = _queue.c.failures + 1
    if dead:
        if conn.execute(update(_queue).where(mine, same).values(state="dead", **values)).rowcount:
            return True
        values["failures"] = 0
        return bool(conn.execute(update(_queue).where(mine).values(state="pending", **values)).rowcount)
    later = _greatest(conn)(_queue.c.due_at, due_at)
    # ``not_before`` holds the backoff against new turns (a stream of turns must not turn a
    # failing conversation into a tight retry loop, nor cut a Retry-After short).
    retry = {"due_at": later, "not_before": due_at}
    return bool(conn.execute(update(_queue).where(mine).values(state="pending", **retry, **values)).rowcount)


def release(conn: Connection, token: str, *, now: datetime) -> int:
    """Give back a claim and any row still leased under it (shutdown); returns the rows released.

    The claim goes first: heartbeats and claims lock claims before rows, and so does this. The
    release does not count as an attempt. While the scope has rows left, its claim row stays,
    expired and under a token nobody holds, as the scope's last service (claims serve the least
    recently served scope first); a scope with nothing queued keeps no row, and so no user id.
    """
    orphan = uuid.uuid4().hex
    scope = conn.execute(
        update(_claims)
        .where(_claims.c.lease_token == token)
        .values(lease_token=orphan, lease_owner="", lease_expires_at=now - RELEASED_AGO)
        .returning(_claims.c.user_id, _claims.c.agent_name)
    ).first()
    if scope is not None:
        left = (
            select(_queue.c.id)
            .where(
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


def unleased(now: datetime) -> dict[str, Any]:
    return {"lease_owner": None, "lease_token": None, "lease_expires_at": None, "updated_at": now}


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


def not_among(conn: Connection, column: Any, ids: Sequence[int]) -> Any:
    """``column NOT IN ids`` with the ids bound as one parameter (an array, or JSON on SQLite).

    ``flush`` excludes every row it has run, so a plain ``NOT IN`` bound one parameter per id:
    the k-th claim of a flush coerced k parameters, quadratic in the flush's size.
    """
    if conn.dialect.name == "postgresql":
        return column != all_(bindparam(None, list(ids), type_=postgresql.ARRAY(BigInteger)))
    listed = func.json_each(bindparam(None, json.dumps(list(ids)))).table_valued("value")
    return column.not_in(select(listed.c.value).scalar_subquery())


def unsettled(conn: Connection, *, owner: str | None = None, exclude: Sequence[int] = ()) -> int:
    """Conversations pending or leased (of ``owner``, or of every process), but ``exclude``."""
    condition: ColumnElement[bool] = _queue.c.state.in_(("pending", "leased"))
    if owner is not None:
        condition = and_(condition, _queue.c.enqueued_by == owner)
    if exclude:
        condition = and_(condition, not_among(conn, _queue.c.id, exclude))
    return int(conn.execute(select(func.count()).select_from(_queue).where(condition)).scalar_one())


def erase_user(conn: Connection, user_id: str) -> int:
    """Delete every queued conversation and claim of ``user_id`` (``memstore erase``)."""
    conn.execute(delete(_claims).where(_claims.c.user_id == user_id))
    return int(conn.execute(delete(_queue).where(_queue.c.user_id == user_id)).rowcount)
