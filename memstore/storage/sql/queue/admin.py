"""Operating the durable queue: its status, and what an operator does with dead rows.

``memstore queue status|retry|purge`` and the workers' housekeeping call these; the rows
themselves are ``queue_table``'s. They act on every tenant: run them on the operator connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, delete, func, or_, select, update

from memstore.document import as_utc
from memstore.scope import DEFAULT_TENANT_ID
from memstore.storage.sql.queue.limits import HELD, QueueLimits
from memstore.storage.sql.schema.models import claims_table as _claims
from memstore.storage.sql.schema.models import queue_table as _queue

THROUGHPUT_WINDOW = timedelta(minutes=15)
"""``queue status`` reports conversations completed per minute over at most this window: from the
first completion in it (at least a minute back) to now, so a burst is not averaged over idle time."""
MIN_THROUGHPUT_WINDOW = timedelta(minutes=1)
DONE_RETENTION = timedelta(hours=1)
"""Done rows (their messages already dropped) are kept this long for the throughput figure."""


@dataclass(frozen=True)
class DeadRow:
    id: int
    thread_id: str
    user_id: str
    agent_name: str
    attempts: int
    last_error: str | None
    updated_at: datetime
    tenant_id: str = DEFAULT_TENANT_ID


@dataclass(frozen=True)
class QueueStatus:
    pending: int
    due: int
    leased: int
    dead: int
    done_recent: int
    oldest_pending_seconds: float | None
    """Age of the oldest turn still waiting (pending or leased): the queue's lag."""
    throughput_per_minute: float
    throughput_window_seconds: float
    """The span ``throughput_per_minute`` is measured over (see ``THROUGHPUT_WINDOW``)."""
    dead_rows: list[DeadRow]
    held_chars: int
    """Characters of the conversations pending, leased or dead: what ``max_queue_chars`` bounds."""
    users_at_share: int
    """Users holding their ``queue_user_share`` of a bound: their new conversations are refused."""
    tenants_at_share: int = 0
    """Tenants holding their ``queue_tenant_share`` of a bound (0 without that cap)."""


def queue_status(
    conn: Connection, now: datetime, limits: QueueLimits, *, dead_limit: int = 20
) -> QueueStatus:
    by_state = select(_queue.c.state, func.count()).group_by(_queue.c.state)
    counts: dict[str, int] = {state: count for state, count in conn.execute(by_state)}
    due = conn.execute(
        select(func.count()).where(_queue.c.state == "pending", _queue.c.due_at <= now)
    ).scalar_one()
    oldest = conn.execute(
        select(func.min(_queue.c.pending_since)).where(_queue.c.state.in_(("pending", "leased")))
    ).scalar_one()
    since = now - THROUGHPUT_WINDOW
    recent, first = conn.execute(
        select(func.count(), func.min(_queue.c.completed_at)).where(
            _queue.c.state == "done", _queue.c.completed_at >= since
        )
    ).one()
    first_at = as_utc(first)
    window = max(MIN_THROUGHPUT_WINDOW, now - first_at) if first_at is not None else THROUGHPUT_WINDOW
    unsettled = HELD
    held_chars = conn.execute(
        select(func.coalesce(func.sum(_queue.c.message_chars), 0)).where(unsettled)
    ).scalar_one()
    at_share = _at_share(conn, (_queue.c.tenant_id, _queue.c.user_id), limits.user_depth, limits.user_chars)
    tenants_at_share = (
        0
        if limits.tenant is None
        else _at_share(conn, (_queue.c.tenant_id,), limits.tenant.depth, limits.tenant.chars)
    )
    dead_rows = [
        DeadRow(
            row.id,
            row.thread_id,
            row.user_id,
            row.agent_name,
            row.attempts,
            row.last_error,
            as_utc(row.updated_at) or now,
            row.tenant_id,
        )
        for row in conn.execute(
            select(
                _queue.c.id,
                _queue.c.thread_id,
                _queue.c.user_id,
                _queue.c.agent_name,
                _queue.c.attempts,
                _queue.c.last_error,
                _queue.c.updated_at,
                _queue.c.tenant_id,
            )
            .where(_queue.c.state == "dead")
            .order_by(_queue.c.updated_at.desc(), _queue.c.id.desc())
            .limit(dead_limit)
        )
    ]
    oldest_at = as_utc(oldest)
    return QueueStatus(
        pending=int(counts.get("pending", 0)),
        due=int(due),
        leased=int(counts.get("leased", 0)),
        dead=int(counts.get("dead", 0)),
        done_recent=int(recent),
        oldest_pending_seconds=None if oldest_at is None else max(0.0, (now - oldest_at).total_seconds()),
        throughput_per_minute=recent / (window.total_seconds() / 60),
        throughput_window_seconds=window.total_seconds(),
        dead_rows=dead_rows,
        held_chars=int(held_chars),
        users_at_share=at_share,
        tenants_at_share=tenants_at_share,
    )


def _at_share(conn: Connection, by: tuple[Any, ...], depth: int, chars: int) -> int:
    """How many groups (users of a tenant, or tenants) hold ``depth`` rows or ``chars`` characters."""
    groups = (
        select(*by)
        .where(HELD)
        .group_by(*by)
        .having(or_(func.count() >= depth, func.sum(_queue.c.message_chars) >= chars))
        .subquery()
    )
    return int(conn.execute(select(func.count()).select_from(groups)).scalar_one())


def _dead(ids: list[int] | None) -> object:
    condition = _queue.c.state == "dead"
    return condition if ids is None else and_(condition, _queue.c.id.in_(ids))


def retry_dead(conn: Connection, now: datetime, ids: list[int] | None = None) -> int:
    """Put dead rows (all, or ``ids``) back as pending and due now, with a full set of tries."""
    return int(
        conn.execute(
            update(_queue)
            .where(_dead(ids))  # type: ignore[arg-type]
            .values(
                state="pending",
                attempts=0,
                failures=0,
                not_before=None,
                due_at=now,
                pending_since=now,
                latest_due_at=now,
                updated_at=now,
            )
        ).rowcount
    )


def purge_dead(conn: Connection, ids: list[int] | None = None) -> int:
    """Delete dead rows (all, or ``ids``): their conversations are given up for good."""
    return int(conn.execute(delete(_queue).where(_dead(ids))).rowcount)  # type: ignore[arg-type]


def sweep_done(conn: Connection, now: datetime) -> int:
    """Delete done rows, and claims expired, older than ``DONE_RETENTION``.

    The heartbeat thread calls it now and then. An expired claim is free for the taking anyway,
    and a released one is kept only as its scope's last service (which orders claims); deleting
    them keeps the table to about the scopes served in that window.
    """
    cutoff = now - DONE_RETENTION
    conn.execute(delete(_claims).where(_claims.c.lease_expires_at < cutoff))
    return int(
        conn.execute(delete(_queue).where(_queue.c.state == "done", _queue.c.completed_at < cutoff)).rowcount
    )


def purge_counts(conn: Connection, ids: list[int] | None = None) -> list[tuple[str, str, int]]:
    """What ``purge_dead`` would delete, as ``(state, user_id, rows)``: the operator sees whose
    conversations are given up before saying yes. Deletes nothing."""
    counted = (
        select(_queue.c.state, _queue.c.user_id, func.count())
        .where(_dead(ids))  # type: ignore[arg-type]
        .group_by(_queue.c.state, _queue.c.user_id)
        .order_by(_queue.c.state, _queue.c.user_id)
    )
    return [(state, user_id, int(rows)) for state, user_id, rows in conn.execute(counted)]
