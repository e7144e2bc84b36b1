"""The database session store on PostgreSQL under contention: the per-user cap holds exactly
when replicas create sessions at the same moment, and a locked session costs a write an error
within ``write_lock_timeout_seconds`` instead of a wait without end."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, text

from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import SessionLimitError, SessionStoreUnavailableError
from memstore.session import SessionKey, SessionLimits, SessionTurn
from memstore.storage.sql.sessions.store import DatabaseSessionStore

pytestmark = pytest.mark.postgres

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
TURN = [SessionTurn("user", "hello", tokens=1)]


def test_the_sessions_per_user_cap_holds_between_concurrent_creators(postgres_url: str) -> None:
    store = DatabaseSessionStore(postgres_url)
    limits = SessionLimits(max_stored_turns=10, max_sessions_per_user=1, ttl_seconds=3600)
    for trial in range(10):
        user = f"u{trial}"
        start = threading.Barrier(2)
        outcomes: list[str] = []

        def create(
            session_id: str,
            user: str = user,
            start: threading.Barrier = start,
            outcomes: list[str] = outcomes,
        ) -> None:
            start.wait()
            try:
                store.append(SessionKey(user, session_id), TURN, now=NOW, limits=limits)
                outcomes.append("stored")
            except SessionLimitError:
                outcomes.append("refused")

        threads = [threading.Thread(target=create, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(outcomes) == ["refused", "stored"], trial
        assert len(store.list_sessions("default", user, now=NOW)) == 1


def test_a_locked_session_fails_the_write_within_the_lock_timeout(
    postgres_url: str, tmp_path: object
) -> None:
    set_memory_config(MemoryConfig(database_url=postgres_url, write_lock_timeout_seconds=1))
    store = DatabaseSessionStore(postgres_url)
    limits = SessionLimits(max_stored_turns=10, max_sessions_per_user=10, ttl_seconds=3600)
    key = SessionKey("alice", "busy")
    store.append(key, TURN, now=NOW, limits=limits)
    holder = create_engine(postgres_url)
    outcome: list[BaseException | None] = []

    def append() -> None:
        try:
            store.append(key, TURN, now=NOW, limits=limits)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    try:
        with holder.connect() as conn, conn.begin():
            conn.execute(text("SELECT 1 FROM memory_sessions WHERE session_id = 'busy' FOR UPDATE"))
            writer = threading.Thread(target=append)
            writer.start()
            writer.join(30)  # only a guard: the lock timeout is 1 s
            assert not writer.is_alive(), "the append waited on the lock past write_lock_timeout_seconds"
    finally:
        holder.dispose()
    assert len(outcome) == 1 and isinstance(outcome[0], SessionStoreUnavailableError)
