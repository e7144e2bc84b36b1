"""What the durable queue may hold: the bounds read that each new conversation passes first.

``max_queue_depth`` and ``max_queue_chars`` bound the rows that keep messages (``HELD``) in
total, ``queue_tenant_share`` of them per tenant and ``queue_user_share`` per user of a tenant
(``queue/bounds.py`` turns the settings into ``QueueLimits``). The read counts every tenant's
rows, so under row-level security it runs on the operator connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, and_, func, select
from sqlalchemy.sql.elements import ColumnElement

from memstore.errors import QueueFullError
from memstore.storage.sql.schema.models import queue_table as _queue

if TYPE_CHECKING:
    from memstore.storage.sql.queue.table import QueuedConversation

NO_ID = ""
"""``user_id`` / ``agent_name`` of a queued conversation without one ('' is never a valid id)."""

HELD = _queue.c.state.in_(("pending", "leased", "dead"))
"""Rows that hold messages and count against the bounds: a dead row keeps its conversation until
an operator retries or purges it, so a user whose turns keep failing cannot grow the table either."""


@dataclass(frozen=True)
class TenantLimits:
    """One tenant's share of the totals (``queue_tenant_share``)."""

    depth: int
    depth_corrections: int
    chars: int


@dataclass(frozen=True)
class QueueLimits:
    """What the table may hold in rows that keep messages (``HELD``): in total, per tenant and per
    user (of a tenant).

    A correction may use ``*_depth_corrections`` instead (the reserve). Checked by each write
    before its upsert, so concurrent writers on PostgreSQL can overshoot by one row each. Tenant
    limits equal to the totals (``queue_tenant_share`` 1.0) never refuse before the totals do.
    """

    depth: int
    depth_corrections: int
    chars: int
    user_depth: int
    user_depth_corrections: int
    user_chars: int
    tenant: TenantLimits | None = None
    """``None``: no tenant cap beyond the totals (the tenant's usage is then not read)."""


MESSAGE_CHARS_OVERHEAD = 24
"""What ``message_chars`` adds per message for its keys and role, as the JSON stores them: a
conversation of many short messages costs what it takes on disk, not only its text."""


def stored_message_chars(messages: Sequence[dict[str, str]]) -> int:
    """A queued conversation's ``message_chars``: its text plus ``MESSAGE_CHARS_OVERHEAD`` a message."""
    return sum(len(message.get("content", "")) + MESSAGE_CHARS_OVERHEAD for message in messages)


def check_bounds(conn: Connection, item: QueuedConversation, chars: int, limits: QueueLimits) -> None:
    """Raise ``QueueFullError`` if storing ``item`` would pass ``limits``; one read over indexes.

    Replacing a held row of the same conversation adds no row, only its growth in characters.
    ``conn`` must see every tenant's rows (under row-level security: the operator connection).
    """
    tenant = _queue.c.tenant_id == item.tenant_id
    user = and_(tenant, _queue.c.user_id == (item.user_id or NO_ID))
    same = and_(
        user,
        _queue.c.thread_id == item.thread_id,
        _queue.c.agent_name == (item.agent_name or NO_ID),
        HELD,
    )

    def usage(condition: ColumnElement[bool]) -> list[Any]:
        count = select(func.count()).where(condition)
        chars = select(func.coalesce(func.sum(_queue.c.message_chars), 0)).where(condition)
        return [count.scalar_subquery(), chars.scalar_subquery()]

    share = limits.tenant
    held = select(_queue.c.message_chars).where(same).scalar_subquery()
    per_tenant = usage(and_(HELD, tenant)) if share is not None else []
    row = conn.execute(select(held, *usage(HELD), *usage(and_(HELD, user)), *per_tenant)).one()
    replacing = row[0] is not None
    stored, total_rows, total_chars, user_rows, user_chars, *tenant_usage = (int(value or 0) for value in row)
    growth = chars - stored
    correction = item.correction_detected
    if not replacing:
        depth = limits.depth_corrections if correction else limits.depth
        if total_rows >= depth:
            raise QueueFullError(f"the queue holds {total_rows} conversations, its limit", kind="full")
        tenant_depth = None if share is None else share.depth_corrections if correction else share.depth
        if tenant_depth is not None and tenant_usage[0] >= tenant_depth:
            raise QueueFullError(
                f"the tenant holds {tenant_usage[0]} queued conversations, its share", kind="tenant_share"
            )
        user_depth = limits.user_depth_corrections if correction else limits.user_depth
        if user_rows >= user_depth:
            raise QueueFullError(
                f"the user holds {user_rows} queued conversations, their share", kind="user_share"
            )
    if growth > 0 and total_chars + growth > limits.chars:
        raise QueueFullError(f"the queue holds {total_chars} characters of {limits.chars}", kind="full")
    if share is not None and growth > 0 and tenant_usage[1] + growth > share.chars:
        raise QueueFullError(
            f"the tenant holds {tenant_usage[1]} queued characters of its share {share.chars}",
            kind="tenant_share",
        )
    if growth > 0 and user_chars + growth > limits.user_chars:
        raise QueueFullError(
            f"the user holds {user_chars} queued characters of their share {limits.user_chars}",
            kind="user_share",
        )
