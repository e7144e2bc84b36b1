"""Settling a leased row: the claim fence, the release folded into the last settle, completion.

A claim does not touch the rows of its scope it does not lease, so a worker whose claim expired
and was taken over still holds row leases under its old token. Every settle (the save's
completion, a retry, a kill) therefore also requires the scope's claim to carry the lease's
token: once a takeover commits, the old worker can commit no row of the scope. On PostgreSQL the
claim row is read ``FOR SHARE``, so a takeover in progress is waited for and then seen, and a
takeover waits for a settle in progress.

The settle of a claim's last row gives the claim back in its own transaction
(``QueueLease.releases_claim``): the claim row goes, or stays expired as the scope's last
service while the scope has other rows waiting (claims serve the scope that has waited longest
first). Claims are locked before queue rows here too, the order every queue writer keeps but a
claim, which locks its candidate's queue row first and waits for neither (``claim_sql.py``); the
release is then the fence, so the row's own statement needs none.

A completion runs inside every save, so its statements are built once per dialect and shape
with named parameters (``settle_parameters``), as the claim's are (``claim_sql.py``).
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, String, and_, bindparam, delete, exists, func, literal, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from memstore.storage.sql.schema.models import claims_table as _claims
from memstore.storage.sql.schema.models import queue_table as _queue

if TYPE_CHECKING:
    from memstore.storage.sql.queue.table import QueueLease

RELEASED_AGO = timedelta(seconds=1)
"""A released claim's lease ends this long before the release, so it is expired at once."""
_TIME = _claims.c.claimed_at.type


def settle_parameters(lease: QueueLease, now: datetime) -> dict[str, Any]:
    """The values the settle statements of ``lease`` run with."""
    return {
        "b_row": lease.row_id,
        "b_tenant": lease.tenant_id,
        "b_user": lease.user_id,
        "b_agent": lease.agent_name,
        "b_token": lease.token,
        "b_generation": lease.generation,
        "b_now": now,
        "b_orphan": uuid.uuid4().hex,
        "b_released": now - RELEASED_AGO,
    }


def _text(name: str) -> Any:
    return bindparam(name, type_=String)


def _claim_of() -> ColumnElement[bool]:
    """The lease's scope's claim, by its primary key, still under the lease's token."""
    return and_(
        _claims.c.tenant_id == _text("b_tenant"),
        _claims.c.user_id == _text("b_user"),
        _claims.c.agent_name == _text("b_agent"),
        _claims.c.lease_token == _text("b_token"),
    )


@functools.cache
def leased_row(dialect: str, fenced: bool) -> ColumnElement[bool]:
    """The lease's row, still leased under its token; ``fenced``: while the scope's claim is too."""
    row = and_(
        _queue.c.id == bindparam("b_row"),
        _queue.c.tenant_id == _text("b_tenant"),
        _queue.c.lease_token == _text("b_token"),
        _queue.c.state == "leased",
    )
    if not fenced:
        return row
    held = select(literal(1)).where(_claim_of())
    if dialect == "postgresql":
        held = held.with_for_update(read=True)
    return and_(row, exists(held))


def unleased(now: Any) -> dict[str, Any]:
    return {"lease_owner": None, "lease_token": None, "lease_expires_at": None, "updated_at": now}


@functools.cache
def completions(dialect: str, fenced: bool, forget: bool) -> tuple[Any, Any]:
    """Complete the row (done, or deleted with ``forget``) at the lease's generation; and, when a
    newer generation arrived meanwhile, put it back to pending instead."""
    mine = leased_row(dialect, fenced)
    now = bindparam("b_now", type_=_TIME)
    this_generation = and_(mine, _queue.c.generation == bindparam("b_generation"))
    if forget:
        done: Any = delete(_queue).where(this_generation)
    else:
        done = (
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
        )
    newer = update(_queue).where(mine).values(state="pending", attempts=0, **unleased(now))
    return done, newer


@functools.cache
def _releases(dialect: str) -> tuple[Any, Any | None]:
    """PostgreSQL: one statement counting the claim rows it deleted or expired. SQLite: the delete,
    which is all a scope with nothing else queued needs, then the update."""
    others = exists(
        select(literal(1)).where(
            _queue.c.tenant_id == _text("b_tenant"),
            _queue.c.user_id == _text("b_user"),
            _queue.c.agent_name == _text("b_agent"),
            _queue.c.state.in_(("pending", "leased")),
            # This row counts at a newer generation: its completion puts it back to pending.
            or_(_queue.c.id != bindparam("b_row"), _queue.c.generation != bindparam("b_generation")),
        )
    )
    expired = {
        "lease_token": _text("b_orphan"),
        "lease_owner": "",
        "lease_expires_at": bindparam("b_released", type_=_TIME),
    }
    gone = delete(_claims).where(_claim_of(), ~others)
    kept = update(_claims).where(_claim_of()).values(**expired)
    if dialect != "postgresql":
        return gone, kept
    gone_cte = gone.returning(_claims.c.lease_token).cte("gone")
    kept_cte = (
        kept.where(~exists(select(gone_cte.c.lease_token))).returning(_claims.c.lease_token).cte("kept")
    )
    counted = select(
        select(func.count()).select_from(gone_cte).scalar_subquery()
        + select(func.count()).select_from(kept_cte).scalar_subquery()
    )
    return counted, None


def release_claim(conn: Connection, values: dict[str, Any]) -> bool:
    """Give back the lease's claim ahead of settling its last row; ``False`` if it is not ours.

    The claim row is deleted when the scope has nothing else waiting or running, else it stays
    under a token nobody holds, expired, as the scope's last service.
    """
    first, second = _releases(conn.dialect.name)
    if second is None:
        return bool(conn.execute(first, values).scalar_one())
    if conn.execute(first, values).rowcount:
        return True
    return bool(conn.execute(second, values).rowcount)
