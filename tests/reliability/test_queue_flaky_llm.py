"""The database queue against a flaky endpoint, and what an operator does with a dead conversation.

30% of the LLM calls fail (half HTTP 503, half a reply slower than ``llm_timeout_seconds``):
every conversation still lands, through the queue's own backoff. One conversation always gets
a malformed reply: it ends dead with the parse error recorded, ``memstore queue status --json``
shows it, and ``memstore queue retry --all`` runs it again once the reply is fixed.
Runs on SQLite and PostgreSQL through the real updater and the local OpenAI-compatible server.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from typing import Any

from click.testing import CliRunner

from memstore.cli import main
from memstore.queue.database import DatabaseUpdateQueue
from memstore.storage.sql import SqlMemoryStorage
from tests.reliability.conftest import Record, configure
from tests.reliability.llm_script import prompt_conversation, turn
from tests.reliability.queue_support import (
    Conversation,
    conversation,
    llm_config,
    lost_facts,
    queue_rows,
    token_reply,
)
from tests.support.openai_server import OpenAIStubServer, ScriptedError

FAILURE_RATE = 0.30
LLM_TIMEOUT = 0.5
MAX_ATTEMPTS = 3
POISON = "remember poison"
POISONED = conversation("f0", None, "poison")


class FlakyEndpoint:
    """The reply function: fails a seeded 30% of calls, and garbles the poison one while ``broken``."""

    def __init__(self) -> None:
        self.random = random.Random(20260715)
        self.lock = threading.Lock()
        self.served: Counter[str] = Counter()
        self.broken = True

    def __call__(self, body: dict[str, Any]) -> str | ScriptedError:
        with self.lock:
            roll = self.random.random()
        if roll < FAILURE_RATE / 2:
            self._count("503")
            return ScriptedError(503, "overloaded")
        if roll < FAILURE_RATE:
            self._count("timeout")
            time.sleep(LLM_TIMEOUT + 0.3)  # the client has given up by the time this is sent
            return token_reply(body)
        if POISON in prompt_conversation(body) and self.broken:
            self._count("malformed")
            return "Sure! Here is what I remembered: the user likes tea."
        self._count("ok")
        return token_reply(body)

    def _count(self, outcome: str) -> None:
        with self.lock:
            self.served[outcome] += 1


def _cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_a_flaky_endpoint_delays_updates_but_loses_none_and_dead_ones_can_be_retried(
    sql_url: str, openai_server: OpenAIStubServer, record: Record
) -> None:
    configure(
        **llm_config(openai_server, database_url=sql_url, llm_timeout_seconds=LLM_TIMEOUT),
        update_retry_base_seconds=0.05,
        update_retry_max_seconds=0.2,
        update_max_attempts=MAX_ATTEMPTS,
        queue_poll_seconds=0.1,
    )
    endpoint = FlakyEndpoint()
    openai_server.default_reply = endpoint
    conversations: list[Conversation] = [
        conversation(f"f{user}", None, f"f{user}-t{thread}") for thread in range(4) for user in range(10)
    ]
    SqlMemoryStorage(sql_url)  # migrates the SQLite file
    queue = DatabaseUpdateQueue(sql_url, workers=4)
    try:
        started = time.monotonic()
        for thread_id, user_id, agent, text in conversations:
            queue.add_nowait(thread_id=thread_id, messages=turn(text), agent_name=agent, user_id=user_id)
        poison_thread, poison_user, _, poison_text = POISONED
        queue.add_nowait(thread_id=poison_thread, messages=turn(poison_text), user_id=poison_user)
        assert queue.wait_idle(60), f"{queue.pending_count} conversation(s) still queued"
        drained = time.monotonic() - started

        lost = lost_facts(sql_url, conversations)
        assert lost == []
        assert endpoint.served["503"] > 0 and endpoint.served["timeout"] > 0
        assert queue.stats.retries >= endpoint.served["503"] + endpoint.served["timeout"]
        status = json.loads(_cli("queue", "status", "--json"))
        assert (status["pending"], status["leased"], status["dead"]) == (0, 0, 1)
        [dead] = status["dead_rows"]
        assert (dead["thread_id"], dead["user_id"]) == ("poison", "f0")
        assert dead["last_error"].startswith("MemoryUpdateParseError: no JSON object")
        assert dead["attempts"] >= MAX_ATTEMPTS
        assert 1 <= endpoint.served["malformed"] <= dead["attempts"], "the poison was retried in a loop"
        failures_before_retry = dict(endpoint.served)

        endpoint.broken = False  # the model (or the prompt) is fixed
        assert _cli("queue", "retry", "--all").strip() == "1 dead conversation(s) queued again"
        assert queue.wait_idle(30)
        assert lost_facts(sql_url, [POISONED]) == []
        status = json.loads(_cli("queue", "status", "--json"))
        assert (status["pending"], status["leased"], status["dead"], status["dead_rows"]) == (0, 0, 0, [])
        assert queue_rows(sql_url)["done"] == len(conversations) + 1
    finally:
        queue.shutdown(5.0)
    calls = sum(endpoint.served.values())
    record(
        conversations=len(conversations) + 1,
        llm_calls=calls,
        failed_calls=endpoint.served["503"] + endpoint.served["timeout"],
        failure_rate=round((endpoint.served["503"] + endpoint.served["timeout"]) / calls, 2),
        served_before_retry=failures_before_retry,
        queue_retries=queue.stats.retries,
        dead_before_retry=1,
        drain_s=round(drained, 1),
        lost=len(lost),
    )
