"""Claiming work from the durable queue: one scope per worker, enforced by the database.

A scope is ``(tenant_id, user_id, agent_name)``. A claim takes a whole scope in
``memory_queue_claims`` (an INSERT, or the take-over of an expired claim, exclusive by the
primary key) and leases up to ``CLAIM_BATCH`` (8) of the scope's claimable rows under the claim's
token, skipping rows another transaction holds (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite
serialises writers). On PostgreSQL that is one statement (``WITH candidate, claimed, leased``),
run as its own transaction; on SQLite two, in one write transaction. A heartbeat extends the
claim and its rows. A claim leaves the scope's other leases alone: a worker that lost its claim
cannot settle them, because every settle also checks the claim (``fence.py``). Lock order,
everywhere but here: claims before queue rows. A PostgreSQL claim locks its candidate's queue row
first, but takes every lock ``SKIP LOCKED`` and waits only for another claim's insert of the same
claim row, so it cannot deadlock a writer that holds a claim row and waits for a queue row.

Claims cross tenants, so they run on the operator connection. Fairness is two-level, by how long
each has waited: the tenant first, then its scope, that has waited longest since the later of its
last service (the tenant's newest claim row, the scope's own) and its oldest due row. A backlog is
served ``CLAIM_BATCH`` rows at a time, in turn with what was due before its last service; neither
one tenant's backlog of many scopes nor a stream of new users or tenants starves anyone
(``claim_sql._candidate``). On PostgreSQL a scope whose rows or claim another transaction holds
is passed over, never waited for.

Every leased row is decoded on its own: a row no driver or codec can read (not UTF-8, a time
that is not one, messages enqueue could not have written) is handed to the runner as
``undecodable``, which kills it, while the claim goes on with the scope's other rows.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import Connection, bindparam, delete, select, update
from sqlalchemy.dialects import sqlite

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
"""Attempts a claim makes before giving up: enough to get past scopes claimed meanwhile, or whose
claim row another transaction holds (each later attempt passes over the scopes tried before)."""
_SQLITE_TIME: Any = _queue.c.captured_at.type.dialect_impl(sqlite.dialect()).result_processor(
    sqlite.dialect(), None
)
"""How SQLAlchemy reads a SQLite time: the claim reads them as bytes, to decode row by row."""
_NOT_A_TIME = datetime.min.replace(tzinfo=UTC)


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
    scope: tuple[str, str, str] | None
    """The first scope in fairness order with claimable rows and no live claim; None when none."""
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
    claim passes over scopes whose rows another transaction holds in the statement itself; one
    that loses its scope to a concurrent claimer, or finds its claim row held, tries again
    without it, at most ``CLAIM_CANDIDATES`` times.
    """
    dialect = conn.dialect.name
    expires = now + timedelta(seconds=lease_seconds)
    tried: list[tuple[str, str, str]] = []
    for _ in range(CLAIM_CANDIDATES):
        shape = Shape(dialect, force, only_owner is not None, bool(exclude), bool(tried))
        token = uuid.uuid4().hex
        values = parameters(
            dialect,
            owner=owner,
            token=token,
            now=now,
            expires=expires,
            only_owner=only_owner,
            exclude=exclude,
            tried=tried,
        )
        attempt = _attempt(conn, shape, values)
        if attempt.scope is None:
            return None
        if attempt.rows:
            return _scope_claim(attempt.rows, token)
        if attempt.won:  # nothing leased under it: give the scope back at once
            conn.execute(delete(_claims).where(_claims.c.lease_token == token))
        if dialect != "postgresql":  # serialised: the next attempt would find the same scope
            return None
        tried.append(attempt.scope)
    return None


def _attempt(conn: Connection, shape: Shape, values: dict[str, Any]) -> _Attempt:
    sql = statements(shape)
    if sql.lease is None:  # PostgreSQL: the whole claim in one statement
        result = conn.execute(sql.claim, values).all()
        first = result[0]
        if first.scope_tenant_id is None:
            return _Attempt(None, False, [])
        leased = [row for row in result if row.id is not None]
        scope = (first.scope_tenant_id, first.scope_user_id, first.scope_agent_name)
        return _Attempt(scope, bool(first.won), leased)
    # SQLite serialises claimers: a candidate is always won, and always has rows to lease.
    claimed = conn.execute(sql.claim, values).first()
    if claimed is None:
        return _Attempt(None, False, [])
    scope = (claimed.tenant_id, claimed.user_id, claimed.agent_name)
    scoped = {**values, "b_tenant": scope[0], "b_user": scope[1], "b_agent": scope[2]}
    return _Attempt(scope, True, list(conn.execute(sql.lease, scoped).all()))


def _scope_claim(rows: list[Any], token: str) -> ScopeClaim:
    """The leased rows as the runner takes them: the conversations, and the rows that do not decode."""
    leased: list[LeasedConversation] = []
    undecodable: list[tuple[QueueLease, str]] = []
    first = rows[0]
    for row in sorted(rows, key=lambda row: (_due(row.due_at), row.id)):
        lease = QueueLease(
            row.id,
            token,
            row.generation,
            tenant_id=row.tenant_id,
            user_id=row.user_id,
            agent_name=row.agent_name,
        )
        try:
            if _due(row.due_at) == _NOT_A_TIME:
                raise ValueError("due_at is not a time")
            conversation = QueuedConversation(
                thread_id=decode_text(row.thread_id, "thread_id"),
                user_id=row.user_id or None,
                agent_name=row.agent_name or None,
                messages=decode_messages(
                    None if row.messages is None else decode_text(row.messages, "messages")
                ),
                correction_detected=bool(row.correction_detected),
                reinforcement_detected=bool(row.reinforcement_detected),
                captured_at=decode_time(row.captured_at, "captured_at"),
                tenant_id=row.tenant_id,
                kind=row.kind,
            )
        except Exception as exc:  # RecursionError included: no row may fail the claim
            undecodable.append((lease, str(exc) or type(exc).__name__))
            continue
        leased.append(LeasedConversation(conversation, lease, row.attempts, row.failures))
    return ScopeClaim(first.user_id, first.agent_name, token, leased, undecodable, tenant_id=first.tenant_id)


def decode_text(raw: str | bytes | None, column: str) -> str:
    """A text column as stored: SQLite's claim reads them as bytes (the driver would fail the
    whole claim on one that is not UTF-8). The error names the column, never its content."""
    if isinstance(raw, str):
        return raw
    if raw is None:
        raise ValueError(f"{column} is NULL")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{column} is not UTF-8 text") from None


def decode_time(raw: datetime | bytes | None, column: str) -> datetime:
    """A time column as stored, in UTC: a datetime (PostgreSQL), bytes of SQLAlchemy's text form
    (SQLite), or None (PostgreSQL's ``infinity``, which the driver cannot load)."""
    if isinstance(raw, datetime):
        return as_utc(raw)
    text = decode_text(raw, column) if raw is not None else None
    try:
        value = None if text is None else _SQLITE_TIME(text)
    except (ValueError, TypeError):
        value = None
    if not isinstance(value, datetime):
        raise ValueError(f"{column} is not a time")
    return as_utc(value)


def _due(raw: datetime | bytes | None) -> datetime:
    """A row's ``due_at``, which orders the claim's rows; ``_NOT_A_TIME`` (first) when it is not one."""
    try:
        return decode_time(raw, "due_at")
    except ValueError:
        return _NOT_A_TIME


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
