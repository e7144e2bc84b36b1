"""PostgreSQL stops (or hangs) while a gateway queues turns and workers process them.

A private throwaway cluster (tests/support/pg_cluster.py) is stopped with a fast shutdown while
a feeder thread keeps calling ``add`` (the request path) and four workers are inside LLM
calls, and restarted three seconds later. Every turn must land. The request path must stay
bounded: during the outage each ``add`` returns at once and its turn waits in the process's
outage buffer, which is written to the database once it is back.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from sqlalchemy import text as sql_text

from memstore.queue.database import DatabaseUpdateQueue
from memstore.storage.sql.engine import get_engine
from tests.reliability.conftest import Record, configure
from tests.reliability.llm_script import turn
from tests.reliability.queue_support import Conversation, conversation, llm_config, lost_facts, queue_rows
from tests.reliability.queue_support import token_reply as remember
from tests.support.openai_server import OpenAIStubServer
from tests.support.pg_cluster import PgCluster

pytestmark = pytest.mark.postgres

USERS = 12
LLM_SECONDS = 0.15
ENQUEUE_TIMEOUT = 1.0
# libpq waits at least 2 s to connect (queue.database.enqueue_engine); the rest is slack for a busy CI box.
SUBMIT_BOUND = 2.0 + 2.0


class SlowModel:
    """The scripted LLM, taking ``LLM_SECONDS`` per call and counting the calls in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = 0

    def __call__(self, body: dict[str, Any]) -> str:
        with self.lock:
            self.in_flight += 1
        time.sleep(LLM_SECONDS)
        with self.lock:
            self.in_flight -= 1
        return remember(body)


class Feeder(threading.Thread):
    """The request path: one ``add`` every ``pace`` seconds, each timed."""

    def __init__(self, queue: DatabaseUpdateQueue, pace: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.pace = pace
        self.sent: list[Conversation] = []
        self.latencies: list[float] = []
        self.buffered_peak = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            n = len(self.sent)
            item = conversation(f"o{n % USERS}", None, f"o{n % USERS}-n{n}")
            thread_id, user_id, agent, text = item
            started = time.monotonic()
            self.queue.add(thread_id=thread_id, messages=turn(text), agent_name=agent, user_id=user_id)
            self.latencies.append(time.monotonic() - started)
            self.sent.append(item)
            # The process's outage buffer: where a turn waits while the database is unreachable.
            self.buffered_peak = max(self.buffered_peak, len(self.queue._buffer))
            self.stop_event.wait(self.pace)


def test_a_database_stopped_during_enqueue_and_processing_loses_no_turn(
    cluster: PgCluster, outage_url: str, openai_server: OpenAIStubServer, record: Record
) -> None:
    configure(
        **llm_config(openai_server, database_url=outage_url),
        debounce_seconds=1,
        queue_lease_seconds=2.0,
        queue_poll_seconds=0.2,
        queue_enqueue_timeout_seconds=ENQUEUE_TIMEOUT,
        update_retry_base_seconds=0.2,
        update_retry_max_seconds=1.0,
    )
    model = SlowModel()
    openai_server.default_reply = model
    queue = DatabaseUpdateQueue(outage_url, workers=4)
    feeder = Feeder(queue)
    try:
        feeder.start()
        deadline = time.monotonic() + 20
        while model.in_flight < 2:
            assert time.monotonic() < deadline, "the workers never got busy"
            time.sleep(0.01)
        in_flight_at_stop = model.in_flight
        cluster.stop()
        sent_before = len(feeder.sent)
        time.sleep(3.0)
        sent_during = len(feeder.sent) - sent_before
        buffered = len(queue._buffer)
        cluster.start()
        time.sleep(1.5)
        feeder.stop_event.set()
        feeder.join(10)
        assert queue.wait_idle(60), f"{queue.pending_count} conversation(s) never ran"
    finally:
        feeder.stop_event.set()
        queue.shutdown(5.0)

    assert in_flight_at_stop >= 1 and sent_during > 10
    assert buffered >= sent_during, "turns sent during the outage were not buffered"
    assert len(queue._buffer) == 0
    lost = lost_facts(outage_url, feeder.sent)
    assert lost == []
    assert queue_rows(outage_url) == {"done": len(feeder.sent), "claims": 0}
    stats = queue.stats
    assert stats.accepted == len(feeder.sent) and stats.rejected_full == 0
    slowest = max(feeder.latencies)
    assert slowest < SUBMIT_BOUND, f"an add took {slowest:.2f} s"
    latencies = sorted(feeder.latencies)
    record(
        conversations=len(feeder.sent),
        sent_during_outage=sent_during,
        buffered_peak=feeder.buffered_peak,
        llm_calls_in_flight_at_stop=in_flight_at_stop,
        llm_calls=len(openai_server.requests),
        retries=stats.retries,
        submit_p50_ms=round(1000 * latencies[len(latencies) // 2], 1),
        submit_max_ms=round(1000 * slowest, 1),
        submit_bound_s=SUBMIT_BOUND,
        lost=len(lost),
    )


def test_a_hung_database_does_not_stall_add(cluster: PgCluster, outage_url: str) -> None:
    configure(database_url=outage_url, debounce_seconds=30, queue_enqueue_timeout_seconds=ENQUEUE_TIMEOUT)
    queue = DatabaseUpdateQueue(outage_url, workers=0)
    queue.add("warm", turn("remember warm"), user_id="h")  # the request path's pool now holds a connection
    returned = threading.Event()

    def request() -> None:
        queue.add("hung", turn("remember hung"), user_id="h")
        returned.set()

    adder = threading.Thread(target=request, daemon=True)
    cluster.freeze()
    try:
        adder.start()
        bounded = returned.wait(SUBMIT_BOUND)
    finally:
        cluster.thaw()
    adder.join(30)
    deadline = time.monotonic() + 20
    while len(queue._buffer) and time.monotonic() < deadline:
        time.sleep(0.1)
    queue.close()
    assert bounded, f"add blocked for more than {SUBMIT_BOUND} s on a hung database"
    with get_engine(outage_url).connect() as conn:
        threads = (
            conn.execute(sql_text("SELECT thread_id FROM memory_queue ORDER BY thread_id")).scalars().all()
        )
    assert threads == ["hung", "warm"], "the turn sent while the server hung reached the queue once"
