"""``InMemorySessionStore``: sessions in this process (tests, the file provider, one process)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from memstore.session import AppendResult, SessionInfo, SessionKey, SessionLimits, SessionTurn
from memstore.storage.sessions.contract import SessionStore, too_many_sessions, too_many_turns


@dataclass
class _Session:
    info: SessionInfo
    turns: list[SessionTurn] = field(default_factory=list)
    next_seq: int = 0


SWEEP_INTERVAL = timedelta(minutes=1)
"""How often an append also drops every expired session: nothing else runs ``expire`` in a
gateway's own process, so this is what keeps a long-running one from growing."""


class InMemorySessionStore(SessionStore):
    """One lock guards every session, so each call is atomic like the other backends' writes."""

    def __init__(self) -> None:
        self._sessions: dict[SessionKey, _Session] = {}
        self._lock = threading.Lock()
        self._swept_at: datetime | None = None

    def _live(self, key: SessionKey, now: datetime) -> _Session | None:
        session = self._sessions.get(key)
        if session is not None and session.info.expires_at <= now:
            del self._sessions[key]
            return None
        return session

    def append(
        self, key: SessionKey, turns: Sequence[SessionTurn], *, now: datetime, limits: SessionLimits
    ) -> AppendResult:
        expires_at = now + timedelta(seconds=limits.ttl_seconds)
        with self._lock:
            if self._swept_at is None or now - self._swept_at >= SWEEP_INTERVAL:
                self._expire_locked(now)
            session = self._live(key, now)
            if session is None:
                mine = sum(
                    1
                    for other, held in self._sessions.items()
                    if (other.tenant_id, other.user_id) == (key.tenant_id, key.user_id)
                    and held.info.expires_at > now
                )
                if mine >= limits.max_sessions_per_user:
                    raise too_many_sessions(limits)
                session = _Session(
                    SessionInfo(key, 0, 0, 0, now, now, expires_at, epoch=uuid.uuid4().hex[:16])
                )
            raw = session.info.turn_count + len(turns)
            if raw > limits.max_stored_turns:
                raise too_many_turns(limits)
            stored = [
                replace(turn, seq=session.next_seq + offset, created_at=now, summary=False)
                for offset, turn in enumerate(turns, start=1)
            ]
            session.next_seq += len(turns)
            session.turns.extend(stored)
            session.info = replace(
                session.info,
                turn_count=raw,
                token_count=session.info.token_count + sum(turn.tokens for turn in turns),
                updated_at=now,
                expires_at=expires_at,
            )
            self._sessions[key] = session
            return AppendResult(session.info, stored)

    def read(self, key: SessionKey, *, now: datetime) -> tuple[SessionInfo | None, list[SessionTurn]]:
        with self._lock:
            session = self._live(key, now)
            return (None, []) if session is None else (session.info, list(session.turns))

    def compress(
        self, key: SessionKey, *, epoch: str, upto_seq: int, summary: SessionTurn, now: datetime
    ) -> bool:
        with self._lock:
            session = self._live(key, now)
            if session is None or session.info.epoch != epoch:
                return False
            if session.info.summary_seq is not None and session.info.summary_seq >= upto_seq:
                return False
            kept = [turn for turn in session.turns if turn.seq > upto_seq]
            session.turns = [replace(summary, seq=upto_seq, created_at=now, summary=True), *kept]
            session.info = replace(
                session.info,
                turn_count=len(kept),
                token_count=sum(turn.tokens for turn in kept),
                compressions=session.info.compressions + 1,
                summary_seq=upto_seq,
            )
            return True

    def clear(self, key: SessionKey) -> bool:
        with self._lock:
            return self._sessions.pop(key, None) is not None

    def list_sessions(
        self, tenant_id: str, user_id: str | None, *, now: datetime, limit: int = 100, offset: int = 0
    ) -> list[SessionInfo]:
        with self._lock:
            infos = [
                session.info
                for key, session in self._sessions.items()
                if (key.tenant_id, key.user_id) == (tenant_id, user_id) and session.info.expires_at > now
            ]
        infos.sort(key=lambda info: (info.updated_at, info.key.session_id), reverse=True)
        return infos[offset : offset + limit]

    def erase_user(self, tenant_id: str, user_id: str) -> int:
        with self._lock:
            doomed = [key for key in self._sessions if (key.tenant_id, key.user_id) == (tenant_id, user_id)]
            for key in doomed:
                del self._sessions[key]
        return len(doomed)

    def expire(self, now: datetime) -> int:
        with self._lock:
            return self._expire_locked(now)

    def _expire_locked(self, now: datetime) -> int:
        self._swept_at = now
        doomed = [key for key, session in self._sessions.items() if session.info.expires_at <= now]
        for key in doomed:
            del self._sessions[key]
        return len(doomed)

    def close(self) -> None:
        """Nothing to release: the sessions live as long as the store."""
