"""PostgreSQL goes away while updates flow, then comes back: nothing is lost, no request stalls.

Runs against a private cluster (tests/support/pg_cluster.py) because the shared test server
must stay up for everyone else. The phases: up, stopped (connections refused), up again,
frozen (SIGSTOP: connections hang, the worst case for a request path), thawed. A feeder thread
plays the gateway the whole time, timing ``after_agent`` and ``memory_context``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import pytest

from memstore.gateway.middleware import MemoryMiddleware
from memstore.queue import MemoryUpdateQueue, set_memory_queue
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.schema.migrate import upgrade
from tests.reliability.conftest import Record, configure, llm_settings
from tests.reliability.llm_script import fact, prompt_conversation, turn, update_reply
from tests.support.openai_server import OpenAIStubServer
from tests.support.pg_cluster import PgCluster

pytestmark = pytest.mark.postgres

USERS = ["u0", "u1", "u2"]
CONTEXT_TIMEOUT = 1.0
_TOKEN = re.compile(r"remember (\S+)")


def remember_reply(body: dict[str, Any]) -> str:
    tokens = _TOKEN.findall(prompt_conversation(body))
    return update_reply([fact(f"fact {token}") for token in tokens])


class Gateway(threading.Thread):
    """Sends one conversation every ``pace`` seconds, round-robin over users, timing both hooks."""

    def __init__(self, pace: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.middleware = MemoryMiddleware()
        self.pace = pace
        self.sent: list[tuple[str, str]] = []
        self.slowest = 0.0
        self.empty_contexts = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        count = 0
        while not self.stop_event.is_set():
            user = USERS[count % len(USERS)]
            token = f"{user}-n{count}"
            started = time.monotonic()
            self.middleware.after_agent(turn(f"remember {token}"), thread_id=f"t-{token}", user_id=user)
            context = self.middleware.memory_context(user_id=user)
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.empty_contexts += context == ""
            self.sent.append((user, token))
            count += 1
            self.stop_event.wait(self.pace)


def stored(url: str, user: str) -> set[str]:
    return {f["content"] for f in SqlMemoryStorage(url).reload(user_id=user)["facts"]}


def test_updates_flowing_through_a_restart_and_a_freeze_all_land(
    cluster: PgCluster,
    outage_url: str,
    openai_server: OpenAIStubServer,
    caplog: pytest.LogCaptureFixture,
    record: Record,
) -> None:
    configure(
        database_url=outage_url,
        debounce_seconds=1,
        update_retry_base_seconds=0.2,
        update_retry_max_seconds=1.0,
        update_max_attempts=60,
        memory_context_timeout_seconds=CONTEXT_TIMEOUT,
        **llm_settings(openai_server),
    )
    openai_server.default_reply = remember_reply
    queue = MemoryUpdateQueue()
    set_memory_queue(queue)
    gateway = Gateway()
    caplog.set_level(logging.WARNING)

    gateway.start()
    time.sleep(1.5)
    cluster.stop()
    time.sleep(3.0)
    cluster.start()
    time.sleep(1.5)
    cluster.freeze()
    time.sleep(3.0)
    cluster.thaw()
    time.sleep(1.0)
    gateway.stop_event.set()
    gateway.join(10)
    queue.flush_nowait()
    assert queue.wait_idle(60), f"queue did not drain: {queue.pending_count} pending"

    stats = queue.stats
    lost = [(user, token) for user, token in gateway.sent if f"fact {token}" not in stored(outage_url, user)]
    assert lost == []
    assert stats.retries > 0, "the outage never reached the updater"
    assert stats.abandoned == stats.errors == stats.rejected_full == 0
    assert gateway.slowest < CONTEXT_TIMEOUT + 1.0
    assert gateway.empty_contexts > 0
    assert "memory store unavailable; continuing without memory" in caplog.text
    assert f"memory context took longer than {CONTEXT_TIMEOUT:.1f} s" in caplog.text
    record(
        conversations=len(gateway.sent),
        retries=stats.retries,
        empty_contexts=gateway.empty_contexts,
        slowest_request_s=round(gateway.slowest, 2),
        bound_s=CONTEXT_TIMEOUT,
        lost=len(lost),
    )


def test_an_outage_longer_than_the_retry_budget_is_reported(
    cluster: PgCluster, outage_url: str, openai_server: OpenAIStubServer, caplog: pytest.LogCaptureFixture
) -> None:
    config = configure(
        database_url=outage_url,
        update_retry_base_seconds=0.05,
        update_retry_max_seconds=0.1,
        update_max_attempts=4,
        **llm_settings(openai_server),
    )
    openai_server.default_reply = remember_reply
    SqlMemoryStorage(outage_url)
    queue = MemoryUpdateQueue()
    caplog.set_level(logging.WARNING, logger="memstore.queue")
    cluster.stop()

    queue.add_nowait(thread_id="t", messages=turn("remember gone"), user_id="u0")
    assert queue.wait_idle(30)

    assert (queue.stats.retries, queue.stats.abandoned) == (config.update_max_attempts - 1, 1)
    delays = [float(d) for d in re.findall(r"retrying in ([0-9.]+) s", caplog.text)]
    assert delays == [0.05, 0.10, 0.10]
    assert "conversation dropped after 4 attempt(s)" in caplog.text
    assert openai_server.requests == [], "a load that fails must not spend an LLM call"


def test_a_database_behind_head_keeps_queued_conversations_until_db_upgrade(
    pg_url: str, openai_server: OpenAIStubServer, caplog: pytest.LogCaptureFixture, record: Record
) -> None:
    upgrade(pg_url, "0001")  # a replica deployed before the DBA ran `memstore db upgrade`
    configure(
        database_url=pg_url,
        update_retry_base_seconds=60,
        update_max_attempts=3,
        **llm_settings(openai_server),
    )
    openai_server.default_reply = remember_reply
    queue = MemoryUpdateQueue()
    caplog.set_level(logging.WARNING)
    try:
        for user in USERS:
            queue.add(thread_id=f"t-{user}", messages=turn(f"remember {user}-token"), user_id=user)
        queue.flush()

        assert queue.pending_count == len(USERS), "conversations were dropped instead of kept for retry"
        assert queue.stats.retries == len(USERS) and queue.stats.skipped == 0
        errors = [
            r for r in caplog.records if r.levelno == logging.ERROR and "memstore db upgrade" in r.message
        ]
        assert len(errors) == len(USERS)
        assert openai_server.requests == []

        upgrade(pg_url)
        queue.flush()  # what the backoff timer does once the retry is due

        assert queue.pending_count == 0
        assert queue.stats.updated == len(USERS)
        lost = [user for user in USERS if stored(pg_url, user) != {f"fact {user}-token"}]
        assert lost == []
    finally:
        queue.clear()
        dispose_engines()
    record(conversations=len(USERS), retries=queue.stats.retries, lost=len(lost))
