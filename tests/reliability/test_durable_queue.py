"""The durable queue survives a SIGKILLed gateway, and a conversation claimed twice lands once.

Both run on SQLite and PostgreSQL through the real ``MemoryUpdater`` and the local
OpenAI-compatible server. "Once in effect" is read from the database itself: each fact is
inserted once in ``memory_history`` and each conversation rewrites its scope's summary once
(see ``queue_support``), and no queue row is left pending, leased or dead.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from memstore.capture.conversation import ConversationContext
from memstore.errors import LeaseLostError
from memstore.queue.database import DatabaseUpdateQueue
from memstore.queue.workers import utcnow
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.queue import claims as queue_claims
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.table import LeasedConversation, ScopeClaim
from memstore.update.updater import MemoryUpdater
from tests.reliability.conftest import Record, configure
from tests.reliability.llm_script import prompt_conversation, turn
from tests.reliability.queue_support import (
    TOKEN,
    audit_counts,
    conversation,
    expected_facts,
    gateway,
    llm_config,
    lost_facts,
    queue_rows,
    stored_facts,
    token_reply,
    wait_drained,
    wait_queued,
)
from tests.support.openai_server import OpenAIStubServer

USERS = 30
THREADS_PER_USER = 2
WORKERS = 4
SLOW_REPLY_SECONDS = 5.0
LEASE_SECONDS = 2.0


def _wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_sigkilled_gateway_loses_nothing_and_applies_nothing_twice(
    sql_url: str, openai_server: OpenAIStubServer, tmp_path: Path, record: Record
) -> None:
    SqlMemoryStorage(sql_url)  # migrated before the gateway starts
    conversations = [
        conversation(f"c{user:02d}", None, f"c{user:02d}-t{thread}")
        for thread in range(THREADS_PER_USER)
        for user in range(USERS)
    ]
    openai_server.default_reply = token_reply
    openai_server.delay = SLOW_REPLY_SECONDS  # so conversations are in flight when the gateway dies
    settings = llm_config(
        openai_server,
        database_url=sql_url,
        queue_lease_seconds=LEASE_SECONDS,
        queue_poll_seconds=0.2,
    )

    with gateway(tmp_path, "doomed", settings, conversations, workers=WORKERS) as doomed:
        wait_queued(doomed)
        _wait_for(lambda: len(openai_server.requests) >= WORKERS, 20, "every worker to call the LLM")
        at_kill = queue_rows(sql_url)
        os.kill(doomed.pid, signal.SIGKILL)
        assert doomed.wait(10) == -signal.SIGKILL
    in_flight = len(openai_server.requests)
    assert at_kill["pending"] >= 50, at_kill
    assert at_kill["leased"] >= WORKERS, at_kill
    assert at_kill["done"] == 0, "a conversation finished before the kill: the LLM was not slow enough"
    assert at_kill["claims"] == WORKERS

    openai_server.delay = 0.0
    configure(**settings)
    started = time.monotonic()
    survivor = DatabaseUpdateQueue(sql_url, workers=WORKERS)
    try:
        assert wait_drained(sql_url, 60), f"{queue_rows(sql_url)} never ran"
    finally:
        survivor.shutdown(5.0)
    recovery = time.monotonic() - started

    expected = expected_facts(conversations)
    stored = stored_facts(sql_url, list(expected))
    lost = sorted(f for scope, facts in expected.items() for f in facts - set(stored[scope]))
    duplicated = sorted(f for facts in stored.values() for f, n in Counter(facts).items() if n > 1)
    assert lost == [] and duplicated == []
    assert {scope: sorted(facts) for scope, facts in stored.items()} == {
        scope: sorted(facts) for scope, facts in expected.items()
    }
    inserted, rewrites = audit_counts(sql_url)
    assert set(inserted.values()) == {1} and len(inserted) == len(conversations)
    assert rewrites == dict.fromkeys(expected, THREADS_PER_USER), "a conversation was applied twice"
    assert queue_rows(sql_url) == {"done": len(conversations), "claims": 0}
    assert survivor.stats.updated == len(conversations)
    # The calls the kill interrupted ran again, once each; nothing else was asked twice.
    assert len(openai_server.requests) == len(conversations) + in_flight
    record(
        conversations=len(conversations),
        pending_at_kill=at_kill["pending"],
        leased_at_kill=at_kill["leased"],
        llm_calls_in_flight_at_kill=in_flight,
        llm_calls=len(openai_server.requests),
        recovery_s=round(recovery, 2),
        lost=len(lost),
        duplicates=len(duplicated),
    )


def test_a_gateway_shut_down_mid_queue_leaves_the_rest_queued_for_the_next_worker(
    sql_url: str, openai_server: OpenAIStubServer, tmp_path: Path, record: Record
) -> None:
    SqlMemoryStorage(sql_url)
    conversations = [conversation(f"d{user:02d}", None, f"d{user:02d}-t0") for user in range(40)]
    openai_server.default_reply = token_reply
    openai_server.delay = 0.5
    settings = llm_config(openai_server, database_url=sql_url, queue_poll_seconds=0.2)

    with gateway(tmp_path, "stopping", settings, conversations, workers=WORKERS) as stopping:
        wait_queued(stopping)
        _wait_for(lambda: len(openai_server.requests) >= WORKERS, 20, "every worker to call the LLM")
        stopping.send_signal(signal.SIGTERM)  # shutdown(5.0): finish what runs, release the rest
        assert stopping.wait(20) == 0
    after_shutdown = queue_rows(sql_url)
    assert after_shutdown["leased"] == after_shutdown["claims"] == after_shutdown["dead"] == 0, after_shutdown
    assert after_shutdown["done"] >= WORKERS and after_shutdown["pending"] > 0, after_shutdown

    openai_server.delay = 0.0
    configure(**settings)
    survivor = DatabaseUpdateQueue(sql_url, workers=WORKERS)
    try:
        assert wait_drained(sql_url, 30)
    finally:
        survivor.shutdown(5.0)
    _, rewrites = audit_counts(sql_url)
    assert lost_facts(sql_url, conversations) == []
    assert rewrites == dict.fromkeys(expected_facts(conversations), 1)
    record(
        conversations=len(conversations),
        done_by_shutdown=after_shutdown["done"],
        left_queued=after_shutdown["pending"],
        leases_left=after_shutdown["leased"],
        lost=0,
    )


def _claim(url: str, owner: str, lease_seconds: float) -> ScopeClaim:
    with get_engine(url).connect() as conn:
        conn.execution_options(**queue_table.write_options(5000))
        with conn.begin():
            claim = queue_claims.claim(conn, owner=owner, now=utcnow(), lease_seconds=lease_seconds)
    assert claim is not None, f"{owner} found nothing to claim"
    return claim


def _context(leased: LeasedConversation) -> ConversationContext:
    item = leased.conversation
    return ConversationContext(
        item.thread_id,
        item.messages,
        item.agent_name,
        item.user_id,
        item.correction_detected,
        item.reinforcement_detected,
        timestamp=item.captured_at,
    )


def test_a_conversation_claimed_twice_lands_once(
    sql_url: str, openai_server: OpenAIStubServer, record: Record
) -> None:
    configure(**llm_config(openai_server, database_url=sql_url))
    calls = itertools.count(1)
    lock = threading.Lock()

    def a_new_answer_each_time(body: dict[str, Any]) -> str:
        # Every call rewrites the summary differently, so a late save always has something to change.
        with lock:
            call = next(calls)
        [token] = TOKEN.findall(prompt_conversation(body))
        return token_reply(body).replace(f"latest {token}", f"latest {token} (call {call})")

    openai_server.default_reply = a_new_answer_each_time
    SqlMemoryStorage(sql_url)  # migrates the SQLite file
    queue = DatabaseUpdateQueue(sql_url, workers=0)
    queue.add_nowait(thread_id="twice", messages=turn("remember twice"), user_id="u")

    stalled = _claim(sql_url, "worker-a", lease_seconds=0.2)
    time.sleep(0.3)  # worker A stalls past its lease (a GC pause, a partitioned node)
    taker = _claim(sql_url, "worker-b", lease_seconds=60)
    [late], [current] = stalled.conversations, taker.conversations
    assert (late.lease.row_id, current.attempts) == (current.lease.row_id, 2)
    assert late.lease.token != current.lease.token

    updater = MemoryUpdater()
    with pytest.raises(LeaseLostError):
        updater.process(_context(late), late.lease)
    assert stored_facts(sql_url, [("u", None)]) == {("u", None): []}, "the stale worker saved"

    assert updater.process(_context(current), current.lease) is True
    with pytest.raises(LeaseLostError):
        updater.process(_context(late), late.lease)  # the stale worker wakes up again, too late

    inserted, rewrites = audit_counts(sql_url)
    assert stored_facts(sql_url, [("u", None)]) == {("u", None): ["fact twice"]}
    assert inserted == {"fact twice": 1}
    assert rewrites == {("u", None): 1}, "the summary was rewritten more than once"
    summary = SqlMemoryStorage(sql_url).reload(user_id="u")["user"]["topOfMind"]["summary"]
    assert summary == "latest twice (call 2)", "the save that landed is not the lease holder's"
    assert queue_rows(sql_url) == {"done": 1, "claims": 1}
    queue.close()
    record(claims=2, llm_calls=len(openai_server.requests), saves_landed=1, refused=2, duplicates=0)


def test_a_queue_that_is_first_to_open_the_embedded_database_migrates_it(
    sqlite_url: str, openai_server: OpenAIStubServer
) -> None:
    """A gateway with injection off (or ``memstore worker``) may touch a fresh SQLite file first."""
    configure(**llm_config(openai_server, database_url=sqlite_url), queue_poll_seconds=0.1)
    openai_server.default_reply = token_reply
    queue = DatabaseUpdateQueue(sqlite_url, workers=1)
    try:
        queue.add_nowait("fresh", turn("remember fresh"), user_id="n")
        assert queue.wait_idle(20)
    finally:
        assert queue.shutdown(5.0), "the queued turn never left the outage buffer"
    assert stored_facts(sqlite_url, [("n", None)]) == {("n", None): ["fact fresh"]}
