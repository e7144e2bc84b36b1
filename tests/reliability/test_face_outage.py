"""Outages and cancellation on both faces of the request path (``face`` fixture: sync, async).

A stopped PostgreSQL (connections refused) and a frozen one (SIGSTOP: connections hang, the worst
case) on a private cluster: ``memory_context`` gives a turn without memory and ``after_agent``
buffers the turn, each within its configured bound, on either face; on the async face the event
loop keeps serving other work the whole time. A request cancelled while its save waits for a
lock leaves nothing half-written, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import create_engine, text

from memstore import aio
from memstore.gateway.middleware import MemoryMiddleware
from memstore.ops import facts
from memstore.queue import get_memory_queue
from memstore.queue.database import DatabaseUpdateQueue
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.schema.migrate import head
from tests.reliability.conftest import configure
from tests.support.app_role import app_role_url
from tests.support.faces import AsyncFace, Face
from tests.support.pg_cluster import PgCluster

T = TypeVar("T")
BOUND = 1.0
SLACK = 1.5
"""Scheduling room on a loaded two-core machine: the bound is 1 s, a stall would be many more."""
TURN = [{"role": "user", "content": "I moved to Lisbon"}, {"role": "assistant", "content": "Noted."}]


def _timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


class Ticker:
    """Counts how often the loop ran a 10 ms timer while an async-face call was in flight."""

    def __init__(self) -> None:
        self.ticks = 0

    async def around(self, call: Callable[[], Awaitable[T]]) -> T:
        stop = asyncio.Event()

        async def tick() -> None:
            while not stop.is_set():
                self.ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        try:
            return await call()
        finally:
            stop.set()
            await ticker


@pytest.fixture
def outage_memory(outage_url: str, tmp_path: Path) -> Iterator[str]:
    configure(
        data_dir=str(tmp_path / "data"),
        database_url=outage_url,
        memory_context_timeout_seconds=BOUND,
        queue_enqueue_timeout_seconds=BOUND,
        write_lock_timeout_seconds=BOUND,
        write_statement_timeout_seconds=BOUND,
    )
    facts.create_memory_fact("Alice drinks green tea", user_id="alice")
    yield outage_url
    reset_memory_storage()


def _buffered() -> int:
    queue = get_memory_queue()
    assert isinstance(queue, DatabaseUpdateQueue)
    return len(queue._buffer)


@pytest.mark.postgres
def test_a_stopped_server_costs_each_face_a_turn_without_memory(
    face: Face, cluster: PgCluster, outage_memory: str
) -> None:
    middleware = MemoryMiddleware()
    assert "green tea" in face.memory_context(middleware, user_id="alice")  # pooled, as in a gateway
    cluster.stop()
    block, took = _timed(lambda: face.memory_context(middleware, user_id="alice"))
    assert block == "" and took < BOUND + SLACK, took
    _, took = _timed(lambda: face.after_agent(middleware, TURN, thread_id="t1", user_id="alice"))
    assert took < BOUND + SLACK, took
    assert _buffered() == 1  # kept in the process, written once the server is back
    cluster.start()
    assert "green tea" in face.memory_context(middleware, user_id="alice")


@pytest.mark.postgres
def test_a_frozen_server_costs_each_face_its_bound_and_never_the_loop(
    face: Face, cluster: PgCluster, outage_memory: str
) -> None:
    middleware = MemoryMiddleware()
    assert "green tea" in face.memory_context(middleware, user_id="alice")
    ticker = Ticker()
    cluster.freeze()
    try:
        if isinstance(face, AsyncFace):
            block, took = _timed(
                lambda: face.run(lambda: ticker.around(lambda: middleware.amemory_context(user_id="alice")))
            )
            # The loop ran its 10 ms timer throughout the wait, not once at the end of it.
            assert ticker.ticks >= 20, ticker.ticks
        else:
            block, took = _timed(lambda: face.memory_context(middleware, user_id="alice"))
        assert block == "" and took < BOUND + SLACK, took
        _, took = _timed(lambda: face.after_agent(middleware, TURN, thread_id="t2", user_id="alice"))
        assert took < BOUND + SLACK, took
        assert _buffered() == 1
    finally:
        cluster.thaw()
    deadline = time.monotonic() + 30
    while _buffered() and time.monotonic() < deadline:  # the buffer drains once the server answers
        time.sleep(0.1)
    assert _buffered() == 0
    assert get_memory_queue().pending_count == 1
    assert "green tea" in face.memory_context(middleware, user_id="alice")


def _hold_the_write_lock(url: str) -> Callable[[], None]:
    """Another writer holding what a save of alice's scope must take; returns its release."""
    if url.startswith("sqlite"):
        holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")

        def release_sqlite() -> None:
            holder.execute("ROLLBACK")
            holder.close()

        return release_sqlite
    engine = create_engine(url)
    conn = engine.connect()
    transaction = conn.begin()
    conn.execute(text("SELECT 1 FROM memory_scopes WHERE user_id = 'alice' FOR UPDATE"))

    def release() -> None:
        transaction.rollback()
        conn.close()
        engine.dispose()

    return release


def test_a_cancelled_save_leaves_nothing_half_written(sql_url: str, tmp_path: Path) -> None:
    configure(data_dir=str(tmp_path / "data"), database_url=sql_url, write_lock_timeout_seconds=20)
    facts.create_memory_fact("First fact", user_id="alice")
    release = _hold_the_write_lock(sql_url)

    async def cancelled_save() -> None:
        save = asyncio.create_task(aio.create_memory_fact("Second fact", user_id="alice"))
        await asyncio.sleep(0.5)  # long enough to be waiting on the lock
        assert not save.done()
        save.cancel()
        with pytest.raises(asyncio.CancelledError):
            await save

    try:
        asyncio.run(_and_close(cancelled_save()))
    finally:
        release()
    stored = facts.get_memory_data(user_id="alice")
    assert [fact["content"] for fact in stored["facts"]] == ["First fact"]
    # The pool is whole after the cancel: the next save on the async face goes through.
    saved = asyncio.run(_and_close(aio.create_memory_fact("Third fact", user_id="alice")))
    assert [fact["content"] for fact in saved["facts"]] == ["First fact", "Third fact"]
    dispose_engines()


def test_a_cancelled_request_does_not_cancel_other_requests(sql_url: str, tmp_path: Path) -> None:
    configure(data_dir=str(tmp_path / "data"), database_url=sql_url)
    for user in ("alice", "bob"):
        facts.create_memory_fact(f"{user} drinks green tea", user_id=user)
    middleware = MemoryMiddleware()

    async def both() -> tuple[str, str]:
        doomed = asyncio.create_task(middleware.amemory_context(user_id="alice"))
        kept = asyncio.create_task(middleware.amemory_context(user_id="bob"))
        await asyncio.sleep(0)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return await kept, await middleware.amemory_context(user_id="alice")

    bob, alice = asyncio.run(_and_close(both()))
    assert "bob drinks" in bob and "alice drinks" in alice
    dispose_engines()


async def _and_close(work: Awaitable[T]) -> T:
    try:
        return await work
    finally:
        await aio.aclose()


@pytest.mark.postgres
def test_a_cancelled_read_under_row_level_security_stays_a_cancel(postgres_url: str, tmp_path: Path) -> None:
    """The read's transaction (opened with the identity's settings) is on a connection the cancel
    invalidated: no ROLLBACK may replace the cancel with an error of its own."""
    with app_role_url(postgres_url) as app:
        configure(data_dir=str(tmp_path / "data"), database_url=app, operator_database_url=postgres_url)
        facts.create_memory_fact("First fact", user_id="alice")
        blocker = create_engine(postgres_url)
        with blocker.connect() as conn:
            conn.execute(text("BEGIN"))
            conn.execute(text("LOCK TABLE memory_scopes IN ACCESS EXCLUSIVE MODE"))  # reads wait

            async def cancelled_read() -> None:
                read = asyncio.create_task(aio.get_memory_data(user_id="alice"))
                await asyncio.sleep(0.5)
                assert not read.done()
                read.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await read

            try:
                asyncio.run(_and_close(cancelled_read()))
            finally:
                conn.execute(text("ROLLBACK"))
        blocker.dispose()
        stored = asyncio.run(_and_close(aio.get_memory_data(user_id="alice")))
        assert [fact["content"] for fact in stored["facts"]] == ["First fact"]
        reset_memory_storage()


def test_a_slow_first_migration_finishes_although_the_requests_give_up(tmp_path: Path) -> None:
    """Building the provider migrates the embedded database; a request's deadline stops waiting
    for it, never the migration itself (else every request would roll it back again)."""
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    configure(data_dir=str(tmp_path / "data"), database_url=url, memory_context_timeout_seconds=0.001)
    middleware = MemoryMiddleware()

    async def requests() -> None:
        assert await middleware.amemory_context(user_id="alice") == ""  # gave up waiting
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _at_head(tmp_path / "fresh.db"):
            await asyncio.sleep(0.05)

    asyncio.run(_and_close(requests()))
    assert _at_head(tmp_path / "fresh.db")
    reset_memory_storage()
    dispose_engines()


def _at_head(path: Path) -> bool:
    with sqlite3.connect(path) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "alembic_version" not in tables:
            return False
        (revision,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
    return bool(revision == head())
