"""The queue as the console lists and charts it: one page of rows in a state, and the last hour
per minute.

``memstore.ops.queue`` gives the status (counts, lag, throughput, the newest dead rows) and does the
retries and purges; the page of rows and the chart series are reads that it has no call for. Done
rows are kept for an hour (``DONE_RETENTION``) with their completion time and the time their oldest
turn arrived, so the last hour's throughput and lag come from them, bucketed by minute; the
pending, leased and dead rows never include the conversation's messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Engine, func, select

from memstore.document import as_utc
from memstore.storage.records import iso
from memstore.storage.sql.queue.admin import DONE_RETENTION
from memstore.storage.sql.schema.models import queue_table as _queue

QueueState = Literal["pending", "leased", "dead"]
QUEUE_STATES: tuple[QueueState, ...] = ("pending", "leased", "dead")
MAX_QUEUE_PAGE = 200
MAX_SERIES_ROWS = 100_000
"""Done rows read for the charts at most (the newest): an hour of a very busy queue."""
_ROW_COLUMNS = (
    _queue.c.id,
    _queue.c.tenant_id,
    _queue.c.kind,
    _queue.c.thread_id,
    _queue.c.user_id,
    _queue.c.agent_name,
    _queue.c.state,
    _queue.c.attempts,
    _queue.c.last_error,
    _queue.c.pending_since,
    _queue.c.due_at,
    _queue.c.lease_owner,
    _queue.c.lease_expires_at,
    _queue.c.updated_at,
    _queue.c.message_chars,
)


def queue_rows(
    engine: Engine, state: QueueState, *, tenant_id: str | None, limit: int, offset: int
) -> dict[str, Any]:
    """One page of the rows in ``state`` (of ``tenant_id``, or every tenant's), oldest first for
    pending and leased (the lag), newest first for dead (the latest failures)."""
    conditions = [_queue.c.state == state]
    if tenant_id is not None:
        conditions.append(_queue.c.tenant_id == tenant_id)
    order = (
        (_queue.c.updated_at.desc(), _queue.c.id.desc())
        if state == "dead"
        else (_queue.c.due_at, _queue.c.id)
    )
    with engine.connect() as conn:
        total = conn.execute(select(func.count()).where(*conditions)).scalar_one()
        rows = conn.execute(
            select(*_ROW_COLUMNS).where(*conditions).order_by(*order).limit(limit).offset(offset)
        )
        listed = [_row_json(row) for row in rows]
    following = offset + len(listed)
    return {
        "rows": listed,
        "total": int(total),
        "limit": limit,
        "offset": offset,
        "next_offset": following if following < total else None,
    }


def _row_json(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "tenant_id": row.tenant_id,
        "kind": row.kind,
        "thread_id": row.thread_id,
        "user_id": row.user_id or None,
        "agent_name": row.agent_name or None,
        "state": row.state,
        "attempts": row.attempts,
        "last_error": row.last_error,
        "pending_since": iso(as_utc(row.pending_since)),
        "due_at": iso(as_utc(row.due_at)),
        "lease_owner": row.lease_owner,
        "lease_expires_at": iso(as_utc(row.lease_expires_at)),
        "updated_at": iso(as_utc(row.updated_at)),
        "message_chars": row.message_chars,
    }


@dataclass(frozen=True)
class Minute:
    start: datetime
    completed: int
    mean_lag_seconds: float | None
    max_lag_seconds: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "start": iso(self.start),
            "completed": self.completed,
            "mean_lag_seconds": self.mean_lag_seconds,
            "max_lag_seconds": self.max_lag_seconds,
        }


def last_hour(engine: Engine, now: datetime) -> list[Minute]:
    """Conversations completed per minute over the last hour, and their lag (completion minus the
    arrival of their oldest turn), from the done rows the queue keeps that long."""
    start = (now - DONE_RETENTION).replace(second=0, microsecond=0) + timedelta(minutes=1)
    query = (
        select(_queue.c.completed_at, _queue.c.pending_since)
        .where(_queue.c.state == "done", _queue.c.completed_at >= start)
        .order_by(_queue.c.completed_at.desc())
        .limit(MAX_SERIES_ROWS)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    minutes = int((now - start).total_seconds() // 60) + 1
    lags: list[list[float]] = [[] for _ in range(minutes)]
    for completed_at, pending_since in rows:
        done, since = as_utc(completed_at), as_utc(pending_since)
        if done is None or since is None:
            continue
        index = int((done - start).total_seconds() // 60)
        if 0 <= index < minutes:
            lags[index].append(max(0.0, (done - since).total_seconds()))
    return [
        Minute(
            start + timedelta(minutes=index),
            len(bucket),
            round(sum(bucket) / len(bucket), 3) if bucket else None,
            round(max(bucket), 3) if bucket else None,
        )
        for index, bucket in enumerate(lags)
    ]
