"""The durable queue's threads outlive any one failure, and an erase keeps the queue's lock order.

A worker thread, ``flush`` and the outage buffer's thread each meet an exception nothing foresaw
(a bug, a row no decoder handles: here a ``ValueError`` such as an unparseable ``captured_at``
raises) by logging it and going on, so one bad row never stops every other user's memory. On
PostgreSQL, the erase of a user whose scope holds a live claim runs beside that claim's heartbeat
without a deadlock: both lock the claim before the queue rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from memstore.capture.conversation import ConversationContext
from memstore.queue import DatabaseUpdateQueue
from memstore.queue.enqueue import QueueWriter, queued_conversation
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.maintenance.erase import erase_user
from memstore.storage.sql.queue import claims as queue_claims
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.table import QueueLease
from tests.reliability.conftest import configure
from tests.reliability.queue_support import queue_rows

SECRET = "SECRET-CONTENT-MARKER"
WAIT_SECONDS = 60.0


def turn(token: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"remember {token} {SECRET}"}, {"role": "assistant", "content": "ok"}]


def wait_until(condition: Callable[[], bool], seconds: float = WAIT_SECONDS) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


class Recorder:
    """An updater with nothing to learn: it notes each conversation it is handed."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def process(self, context: ConversationContext, lease: QueueLease | None = None) -> bool:
        self.threads.append(context.thread_id)
        return False


class FailingFirst:
    """``real``, except that its first ``times`` calls raise what the claim's decoding raised on
    the reviewer's row. A plain function (``wrap``) so it binds as a method too."""

    def __init__(self, real: Callable[..., Any], times: int) -> None:
        self.real = real
        self.times = times
        self.calls = 0
        self._lock = threading.Lock()

    def wrap(self) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls += 1
                fail = self.calls <= self.times
            if fail:
                raise ValueError("Invalid isoformat string: 'yesterday'")
            return self.real(*args, **kwargs)

        return call


def unexpected(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info and "failed unexpectedly" in r.getMessage()]


def feed(url: str, *users: str) -> None:
    """Queue one conversation per user, due now, from a process that runs none of them."""
    feeder = DatabaseUpdateQueue(url, workers=0)
    for user in users:
        feeder.add_nowait(f"thread-{user}", turn(user), user_id=user)
    feeder.close()


# -- (a) a worker thread -----------------------------------------------------------------------


def test_a_claim_that_raises_ends_no_worker_and_the_next_user_is_run(
    sql_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    configure(database_url=sql_url, extractor="rules", queue_workers=0, queue_poll_seconds=0.05)
    feed(sql_url, "bob")
    failing = FailingFirst(queue_claims.claim, times=4)
    monkeypatch.setattr(queue_claims, "claim", failing.wrap())
    recorder = Recorder()
    with caplog.at_level(logging.INFO, logger="memstore"):
        queue = DatabaseUpdateQueue(sql_url, lambda: recorder, workers=2)
        try:
            wait_until(
                lambda: "thread-bob" in recorder.threads or not any(t.is_alive() for t in queue._threads)
            )
            alive = [thread.is_alive() for thread in queue._threads]
        finally:
            queue.close()
    assert alive == [True, True], "a claim's exception ended a worker thread"
    assert failing.calls > failing.times, "the workers did not claim again after the failures"
    assert recorder.threads == ["thread-bob"]
    assert queue_rows(sql_url)["done"] == 1
    [logged] = unexpected(caplog)  # once with its traceback, its repeats in a line
    assert logged.levelno == logging.ERROR and "worker" in logged.getMessage()
    assert SECRET not in caplog.text and "bob" not in caplog.text


# -- (b) flush ----------------------------------------------------------------------------------


@pytest.mark.parametrize("failing_at", ["claim", "updater factory", "settle"])
def test_flush_logs_an_unexpected_failure_and_returns(
    sqlite_url: str, failing_at: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    configure(database_url=sqlite_url, extractor="rules", queue_workers=0)
    recorder = Recorder()
    factory: Callable[[], Recorder] = lambda: recorder  # noqa: E731
    if failing_at == "claim":
        monkeypatch.setattr(queue_claims, "claim", FailingFirst(queue_claims.claim, times=1).wrap())
    elif failing_at == "updater factory":
        factory = FailingFirst(factory, times=1).wrap()
    else:  # nothing to learn: the row is completed by a settle of the queue's own
        monkeypatch.setattr(queue_table, "complete", FailingFirst(queue_table.complete, times=1).wrap())
    queue = DatabaseUpdateQueue(sqlite_url, factory, workers=0)
    try:
        queue.add("thread-carol", turn("carol"), user_id="carol")
        with caplog.at_level(logging.INFO, logger="memstore"):
            queue.flush()  # raised before: into the caller's request
        assert len(unexpected(caplog)) == 1
        assert SECRET not in caplog.text and "carol" not in caplog.text
        assert queue.pending_count == 1, "the conversation did not stay queued"
        queue.flush()  # the failure is gone: the conversation runs
        assert queue.pending_count == 0
    finally:
        queue.close()
    assert "thread-carol" in recorder.threads


# -- the outage buffer's thread -----------------------------------------------------------------


def test_the_outage_buffer_s_thread_outlives_a_write_that_raises(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = configure(database_url=sqlite_url, extractor="rules", queue_workers=0, queue_poll_seconds=0.05)
    monkeypatch.setattr(QueueWriter, "write", FailingFirst(QueueWriter.write, times=1).wrap())
    queue = DatabaseUpdateQueue(sqlite_url, workers=0)
    try:
        item = queued_conversation(ConversationContext("thread-dave", turn("dave"), None, "dave"))
        with caplog.at_level(logging.INFO, logger="memstore"):
            queue._to_buffer(item, False, config)  # as an outage leaves it
            wait_until(lambda: queue._buffer.empty() or not queue._buffer_thread.is_alive())  # type: ignore[union-attr]
        assert queue._buffer.empty(), "the buffer's thread died with its turn unwritten"
    finally:
        queue.close()
    assert queue_rows(sqlite_url)["pending"] == 1
    assert len(unexpected(caplog)) == 1 and SECRET not in caplog.text


# -- (c) erase beside the heartbeat (PostgreSQL) --------------------------------------------------


def _blocked(engine: Engine, pid: int) -> bool:
    with engine.connect() as conn:
        blockers = conn.execute(text("SELECT cardinality(pg_blocking_pids(:pid))"), {"pid": pid})
        return bool(blockers.scalar_one())


@pytest.mark.postgres
def test_an_erase_beside_the_heartbeat_of_a_claim_in_the_user_s_scope_does_not_deadlock(
    postgres_url: str,
) -> None:
    """The reviewer's interleaving, on the real ``erase_user`` and ``heartbeat``: the erase takes
    its first queue lock (claims or rows, whichever it deletes first), the heartbeat then runs
    into it, and only then does the erase go on to the other. Taken in opposite orders, the two
    deadlock and PostgreSQL aborts one; in the same order, the heartbeat waits, then finds the
    claim gone."""
    configure(database_url=postgres_url, extractor="rules", queue_workers=0)
    feed(postgres_url, "erin")
    engine = get_engine(postgres_url)
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        claim = queue_claims.claim(conn, owner="worker", now=datetime.now(UTC), lease_seconds=60, force=True)
    assert claim is not None and claim.conversations, "the scope was not claimed"
    erase_holds_a_lock = threading.Event()
    heartbeat_pid: list[int] = []
    interleaved: list[bool] = []
    outcome: dict[str, str] = {}

    def after_execute(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if threading.current_thread().name != "eraser" or erase_holds_a_lock.is_set():
            return
        if not statement.lstrip().startswith("DELETE FROM memory_queue"):
            return
        erase_holds_a_lock.set()
        # The erase goes on only once the heartbeat waits on a lock the erase holds.
        interleaved.append(wait_until(lambda: bool(heartbeat_pid) and _blocked(engine, heartbeat_pid[0])))

    def eraser() -> None:
        try:
            counts = erase_user(engine, "erin", datetime.now(UTC))
            outcome["erase"] = f"committed, {counts['memory_queue']} queue row(s)"
        except Exception as exc:
            outcome["erase"] = f"{type(exc).__name__}: {exc}".splitlines()[0]

    def heartbeat() -> None:
        if not erase_holds_a_lock.wait(WAIT_SECONDS):
            outcome["heartbeat"] = "the erase never deleted from the queue"
            return
        try:
            with engine.begin() as conn:
                heartbeat_pid.append(int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()))
                alive = queue_claims.heartbeat(conn, [claim.token], now=datetime.now(UTC), lease_seconds=60)
            outcome["heartbeat"] = f"committed, {len(alive)} claim(s) alive"
        except Exception as exc:
            outcome["heartbeat"] = f"{type(exc).__name__}: {exc}".splitlines()[0]

    event.listen(Engine, "after_cursor_execute", after_execute)
    try:
        threads = [threading.Thread(target=eraser, name="eraser"), threading.Thread(target=heartbeat)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(2 * WAIT_SECONDS)
    finally:
        event.remove(Engine, "after_cursor_execute", after_execute)
    assert interleaved == [True], "the heartbeat never waited on the erase"
    assert outcome == {"erase": "committed, 1 queue row(s)", "heartbeat": "committed, 0 claim(s) alive"}
    assert queue_rows(postgres_url) == {"claims": 0}
