"""``DatabaseSessionStore``: sessions in the memory database, SQLite or PostgreSQL.

Every call runs as the session's user in its tenant (``identity.py``), so on PostgreSQL the
row-level security of ``memory_sessions`` and ``memory_session_turns`` holds it to that user's
rows whatever the statement says. A write locks the session row first (``FOR UPDATE``;
SQLite's writers are serialised by ``BEGIN IMMEDIATE``), so an append and a compression of one
session take turns: the append's turns are numbered after the row's ``next_seq`` and the
compression recounts the raw turns after its cut, whichever commits first.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Row, and_, delete, func, insert, select, update

from memstore.document import as_utc
from memstore.errors import SessionStoreUnavailableError
from memstore.scope import Identity
from memstore.session import AppendResult, SessionInfo, SessionKey, SessionLimits, SessionTurn
from memstore.storage.sessions.contract import SessionStore, too_many_sessions, too_many_turns
from memstore.storage.sql.maintenance.erase import lock_user
from memstore.storage.sql.maintenance.operator import operator_engine
from memstore.storage.sql.queue.table import insert_for
from memstore.storage.sql.schema.models import session_turns_table as _turns
from memstore.storage.sql.schema.models import sessions_table as _sessions
from memstore.storage.sql.scoped import ScopedConnections

NO_ID = ""
"""``user_id`` and ``agent_name`` of a session without one, as the queue stores them."""
_KEY_COLUMNS = ("tenant_id", "user_id", "agent_name", "session_id")


def key_values(key: SessionKey) -> dict[str, str]:
    return {
        "tenant_id": key.tenant_id,
        "user_id": key.user_id or NO_ID,
        "agent_name": key.agent_name or NO_ID,
        "session_id": key.session_id,
    }


def _is(table: Any, key: SessionKey) -> Any:
    return and_(*(table.c[name] == value for name, value in key_values(key).items()))


class DatabaseSessionStore(SessionStore):
    def __init__(self, database_url: str) -> None:
        self._db = ScopedConnections(database_url, SessionStoreUnavailableError, "sessions")

    @property
    def _engine(self) -> Engine:
        return self._db.engine

    def close(self) -> None:
        """Nothing to release: the engine is the process's, shared with the memory storage."""

    def _write(self, key: SessionKey, doing: str) -> AbstractContextManager[Connection]:
        return self._db.write(Identity.of(key.user_id, tenant_id=key.tenant_id), doing)

    def _read(self, tenant_id: str, user_id: str | None) -> AbstractContextManager[Connection]:
        return self._db.read(Identity.of(user_id, tenant_id=tenant_id))

    def _locked(self, conn: Connection, key: SessionKey) -> Row[Any] | None:
        return conn.execute(select(_sessions).where(_is(_sessions, key)).with_for_update()).first()

    def append(
        self, key: SessionKey, turns: Sequence[SessionTurn], *, now: datetime, limits: SessionLimits
    ) -> AppendResult:
        expires_at = now + timedelta(seconds=limits.ttl_seconds)
        with self._write(key, "append to") as conn:
            row = self._locked(conn, key)
            if row is not None and as_utc(row.expires_at) <= now:
                self._delete(conn, key)  # expired: the session starts afresh
                row = None
            if row is None:
                row = self._create(conn, key, now=now, limits=limits)
            if row.turn_count + len(turns) > limits.max_stored_turns:
                raise too_many_turns(limits)
            first = row.next_seq + 1
            tokens = sum(turn.tokens for turn in turns)
            conn.execute(
                update(_sessions)
                .where(_is(_sessions, key))
                .values(
                    next_seq=_sessions.c.next_seq + len(turns),
                    turn_count=_sessions.c.turn_count + len(turns),
                    token_count=_sessions.c.token_count + tokens,
                    updated_at=now,
                    expires_at=expires_at,
                )
            )
            stored = [
                SessionTurn(
                    turn.role, turn.content, turn.name, turn.tool_calls, first + offset, now, turn.tokens
                )
                for offset, turn in enumerate(turns)
            ]
            conn.execute(insert(_turns), [_turn_row(key, turn) for turn in stored])
            info = _info(key, row)
        return AppendResult(
            SessionInfo(
                key,
                row.turn_count + len(turns),
                row.token_count + tokens,
                info.compressions,
                info.created_at,
                now,
                expires_at,
                info.epoch,
                info.summary_seq,
            ),
            stored,
        )

    def _create(self, conn: Connection, key: SessionKey, *, now: datetime, limits: SessionLimits) -> Row[Any]:
        values = key_values(key)
        # PostgreSQL: the user's creations (and an erase) take turns, so the cap holds exactly.
        lock_user(conn, values["user_id"], key.tenant_id)
        live = conn.execute(
            select(func.count())
            .select_from(_sessions)
            .where(
                _sessions.c.tenant_id == values["tenant_id"],
                _sessions.c.user_id == values["user_id"],
                _sessions.c.expires_at > now,
            )
        ).scalar_one()
        if live >= limits.max_sessions_per_user:
            raise too_many_sessions(limits)
        # Another replica may create the session at the same moment: its row wins, and is locked next.
        conn.execute(
            insert_for(conn)(_sessions)
            .values(
                **values,
                epoch=uuid.uuid4().hex[:16],
                next_seq=0,
                turn_count=0,
                token_count=0,
                compressions=0,
                created_at=now,
                updated_at=now,
                expires_at=now + timedelta(seconds=limits.ttl_seconds),
            )
            .on_conflict_do_nothing()
        )
        row = self._locked(conn, key)
        assert row is not None
        return row

    def read(self, key: SessionKey, *, now: datetime) -> tuple[SessionInfo | None, list[SessionTurn]]:
        # One statement, so the bookkeeping and the turns come from one snapshot.
        joined = _sessions.outerjoin(
            _turns, and_(*(_turns.c[name] == _sessions.c[name] for name in _KEY_COLUMNS))
        )
        with self._read(key.tenant_id, key.user_id) as conn:
            rows = conn.execute(
                select(*_SESSION_COLUMNS, *_TURN_COLUMNS)
                .select_from(joined)
                .where(_is(_sessions, key), _sessions.c.expires_at > now)
                .order_by(_turns.c.seq)
            ).all()
        if not rows:
            return None, []
        return _info(key, rows[0]), [_turn(row) for row in rows if row.seq is not None]

    def compress(
        self, key: SessionKey, *, epoch: str, upto_seq: int, summary: SessionTurn, now: datetime
    ) -> bool:
        with self._write(key, "compress") as conn:
            row = self._locked(conn, key)
            if row is None or as_utc(row.expires_at) <= now or row.epoch != epoch:
                return False
            if row.summary_seq is not None and row.summary_seq >= upto_seq:
                return False
            conn.execute(delete(_turns).where(_is(_turns, key), _turns.c.seq <= upto_seq))
            stored = SessionTurn("system", summary.content, None, None, upto_seq, now, summary.tokens, True)
            conn.execute(insert(_turns).values(_turn_row(key, stored)))
            count, tokens = conn.execute(
                select(func.count(), func.coalesce(func.sum(_turns.c.tokens), 0)).where(
                    _is(_turns, key), _turns.c.seq > upto_seq
                )
            ).one()
            conn.execute(
                update(_sessions)
                .where(_is(_sessions, key))
                .values(
                    turn_count=count,
                    token_count=tokens,
                    summary_seq=upto_seq,
                    compressions=_sessions.c.compressions + 1,
                )
            )
        return True

    def clear(self, key: SessionKey) -> bool:
        with self._write(key, "clear") as conn:
            return self._delete(conn, key)

    @staticmethod
    def _delete(conn: Connection, key: SessionKey) -> bool:
        conn.execute(delete(_turns).where(_is(_turns, key)))
        return bool(conn.execute(delete(_sessions).where(_is(_sessions, key))).rowcount)

    def list_sessions(
        self, tenant_id: str, user_id: str | None, *, now: datetime, limit: int = 100, offset: int = 0
    ) -> list[SessionInfo]:
        with self._read(tenant_id, user_id) as conn:
            rows = conn.execute(
                select(_sessions)
                .where(
                    _sessions.c.tenant_id == tenant_id,
                    _sessions.c.user_id == (user_id or NO_ID),
                    _sessions.c.expires_at > now,
                )
                .order_by(_sessions.c.updated_at.desc(), _sessions.c.session_id.desc())
                .limit(limit)
                .offset(offset)
            ).all()
        return [
            _info(
                SessionKey(user_id, row.session_id, row.agent_name or None, tenant_id),
                row,
            )
            for row in rows
        ]

    def erase_user(self, tenant_id: str, user_id: str) -> int:
        key = SessionKey(user_id, "erase", None, tenant_id)  # the identity of the user, any session
        with self._write(key, "erase") as conn:
            return erase_sessions(conn, tenant_id, user_id)

    def expire(self, now: datetime) -> int:
        """Across every tenant, so on the operator connection (``operator_database_url``).

        One statement whose foreign key takes the turns with their session: a session an append
        has just renewed is re-checked after its lock and kept, turns and all.
        """
        engine = operator_engine(self._engine, "expire sessions")
        with self._db.guard("expire"), engine.connect() as conn:
            conn.execution_options(**self._db.write_options)
            with conn.begin():
                return int(conn.execute(delete(_sessions).where(_sessions.c.expires_at <= now)).rowcount)


def erase_sessions(conn: Connection, tenant_id: str, user_id: str) -> int:
    """Delete every session of the user in the tenant (the erase's transaction calls it too)."""
    mine = and_(_turns.c.tenant_id == tenant_id, _turns.c.user_id == user_id)
    conn.execute(delete(_turns).where(mine))
    return int(
        conn.execute(
            delete(_sessions).where(_sessions.c.tenant_id == tenant_id, _sessions.c.user_id == user_id)
        ).rowcount
    )


_SESSION_COLUMNS = [
    _sessions.c[name]
    for name in (
        "turn_count",
        "token_count",
        "compressions",
        "created_at",
        "updated_at",
        "expires_at",
        "epoch",
        "summary_seq",
    )
]
_TURN_COLUMNS = [
    _turns.c[name] for name in ("role", "content", "name", "tool_calls", "seq", "tokens", "is_summary")
] + [_turns.c.created_at.label("turn_created_at")]


def _turn_row(key: SessionKey, turn: SessionTurn) -> dict[str, Any]:
    return {
        **key_values(key),
        "seq": turn.seq,
        "role": turn.role,
        "content": turn.content,
        "name": turn.name,
        "tool_calls": turn.tool_calls,
        "tokens": turn.tokens,
        "is_summary": turn.summary,
        "created_at": turn.created_at,
    }


def _turn(row: Row[Any]) -> SessionTurn:
    return SessionTurn(
        row.role,
        row.content,
        row.name,
        row.tool_calls,
        int(row.seq),
        as_utc(row.turn_created_at),
        int(row.tokens),
        bool(row.is_summary),
    )


def _info(key: SessionKey, row: Row[Any]) -> SessionInfo:
    return SessionInfo(
        key,
        int(row.turn_count),
        int(row.token_count),
        int(row.compressions),
        as_utc(row.created_at),
        as_utc(row.updated_at),
        as_utc(row.expires_at),
        row.epoch,
        None if row.summary_seq is None else int(row.summary_seq),
    )
