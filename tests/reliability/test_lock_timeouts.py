"""A lock held on one scope costs that scope a retry, never everyone else a wait.

PostgreSQL: another connection holds a row lock on one user's scope (a stuck transaction); the
queue must save the other users meanwhile and retry the locked one. SQLite: another process holds
the write lock; a save gives up after the configured busy timeout instead of waiting it out.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from memstore.document import create_empty_memory
from memstore.errors import StorageUnavailableError
from memstore.queue import MemoryUpdateQueue
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from tests.reliability.conftest import Record, configure, llm_settings
from tests.reliability.llm_script import fact, prompt_conversation, turn, update_reply
from tests.support.openai_server import OpenAIStubServer

GUARD_SECONDS = 30.0
"""How long a test waits for what the fix makes happen within a second; reached only when broken."""

_TOKEN = re.compile(r"remember (\S+)")


def remember_reply(body: dict[str, Any]) -> str:
    return update_reply([fact(f"fact {token}") for token in _TOKEN.findall(prompt_conversation(body))])


def stored(url: str, user: str) -> set[str]:
    return {f["content"] for f in SqlMemoryStorage(url).reload(user_id=user)["facts"]}


def seed(url: str, *users: str) -> None:
    storage = SqlMemoryStorage(url)
    for user in users:
        document = create_empty_memory()
        document["facts"] = [{"id": "seed", "content": f"{user} exists", "category": "context"}]
        assert storage.save(document, user_id=user)


@contextmanager
def row_locked(url: str, user: str) -> Iterator[None]:
    """A transaction elsewhere that holds ``user``'s scope row, like a stuck writer."""
    with get_engine(url).connect() as conn, conn.begin():
        conn.execute(text("SELECT id FROM memory_scopes WHERE user_id = :u FOR UPDATE"), {"u": user})
        yield


def wait_for(condition: Any) -> bool:
    deadline = time.monotonic() + GUARD_SECONDS
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.postgres
def test_a_locked_scope_is_retried_while_other_users_are_saved(
    postgres_url: str, openai_server: OpenAIStubServer, record: Record
) -> None:
    configure(
        database_url=postgres_url,
        write_lock_timeout_seconds=0.5,
        update_retry_base_seconds=0.2,
        update_retry_max_seconds=0.5,
        update_max_attempts=100,
        **llm_settings(openai_server),
    )
    openai_server.default_reply = remember_reply
    seed(postgres_url, "stuck", "free")
    queue = MemoryUpdateQueue()
    try:
        with row_locked(postgres_url, "stuck"):
            # The locked scope first: before the fix the worker waited on it with everyone behind.
            queue.add(thread_id="t-stuck", messages=turn("remember s1"), user_id="stuck")
            queue.add(thread_id="t-free", messages=turn("remember f1"), user_id="free")
            started = time.monotonic()
            queue.flush_nowait()
            free_saved = wait_for(lambda: "fact f1" in stored(postgres_url, "free"))
            free_delay = time.monotonic() - started
            assert free_saved, "another user's update waited for the locked scope"
            assert "fact s1" not in stored(postgres_url, "stuck")
            assert queue.stats.retries >= 1
        assert queue.wait_idle(GUARD_SECONDS)
    finally:
        queue.clear()
    assert "fact s1" in stored(postgres_url, "stuck")
    stats = queue.stats
    assert (stats.updated, stats.abandoned, stats.errors) == (2, 0, 0)
    record(lock_timeout_s=0.5, other_user_delay_s=round(free_delay, 2), retries=stats.retries, lost=0)


def save_while_locked(url: str, storage: SqlMemoryStorage, document: dict[str, Any]) -> object:
    """Save ``document`` for "stuck" while its row is locked elsewhere; what the save returned or raised.

    The lock is held until the save finishes or ``GUARD_SECONDS`` pass; a save still waiting then
    is a failure (it would have waited as long as the lock was held).
    """
    outcome: list[object] = []

    def save() -> None:
        try:
            outcome.append(storage.save(document, user_id="stuck"))
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=save)
    with row_locked(url, "stuck"):
        worker.start()
        worker.join(GUARD_SECONDS)
        waited_out = worker.is_alive()
    worker.join()
    assert not waited_out, f"the save waited on the lock for {GUARD_SECONDS:.0f} s"
    return outcome[0]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("lock_timeout", "statement_timeout", "sqlstate"),
    [(0.3, 30.0, "55P03"), (30.0, 0.3, "57014")],
    ids=["lock_timeout", "statement_timeout"],
)
def test_postgresql_write_timeouts_are_outages(
    postgres_url: str, lock_timeout: float, statement_timeout: float, sqlstate: str
) -> None:
    configure(
        database_url=postgres_url,
        write_lock_timeout_seconds=lock_timeout,
        write_statement_timeout_seconds=statement_timeout,
    )
    seed(postgres_url, "stuck")
    storage = SqlMemoryStorage(postgres_url)
    document = storage.load(user_id="stuck")
    document["facts"].append({"id": "late", "content": "saved once the lock is gone"})

    failure = save_while_locked(postgres_url, storage, document)

    assert isinstance(failure, StorageUnavailableError)
    cause = failure.__cause__
    assert isinstance(cause, DBAPIError) and getattr(cause.orig, "sqlstate", None) == sqlstate
    assert storage.save(document, user_id="stuck")  # the same document goes through afterwards
    assert "saved once the lock is gone" in stored(postgres_url, "stuck")


def test_sqlite_save_gives_up_after_the_busy_timeout(sqlite_url: str, record: Record) -> None:
    configure(database_url=sqlite_url, write_lock_timeout_seconds=0.5)
    seed(sqlite_url, "alice")
    storage = SqlMemoryStorage(sqlite_url)
    document = storage.load(user_id="alice")
    document["facts"].append({"id": "late", "content": "saved once the lock is gone"})

    holder = sqlite3.connect(
        sqlite_url.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False
    )
    holder.execute("BEGIN IMMEDIATE")  # another process in the middle of a write
    # Released well before the old fixed 30 s busy timeout: a save that waits it out succeeds.
    release = threading.Timer(10.0, holder.rollback)
    release.start()
    started = time.monotonic()
    try:
        with pytest.raises(StorageUnavailableError, match="locked"):
            storage.save(document, user_id="alice")
        waited = time.monotonic() - started
    finally:
        release.cancel()
        holder.rollback()
        holder.close()
    assert storage.save(document, user_id="alice")
    assert "saved once the lock is gone" in stored(sqlite_url, "alice")
    record(busy_timeout_s=0.5, waited_s=round(waited, 2), lost=0)
