"""``/metrics`` (issue 20): a real scrape, parsed as Prometheus parses it, after real work.

The work: an update through the real updater and the local OpenAI-compatible server, a load, a
save that evicts at ``max_facts``, a failing LLM call, and a turn waiting in the durable queue.
Counters are process-wide, so the test reads how much each grew. No label may carry the user id
or any fact's content.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from memstore.config import SQL_STORAGE_CLASS, MemoryConfig, set_memory_config
from memstore.integrations.metrics import create_metrics_router
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.table import QueuedConversation
from memstore.update.updater import MemoryUpdater
from tests.support.openai_server import OpenAIStubServer, ScriptedError

USER = "metrics-user-7f3a"
SECRET_FACT = "User keeps a pet axolotl named Bubbles"
REPLY = json.dumps(
    {
        "user": {},
        "history": {},
        "newFacts": [{"content": SECRET_FACT, "category": "personal", "confidence": 0.9}],
        "factsToRemove": [],
    }
)


def _scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            labels: Any = tuple(sorted(sample.labels.items()))
            samples[(sample.name, labels)] = sample.value
    assert USER not in answer.text and "axolotl" not in answer.text
    return samples


def _grew(before: dict[Any, float], after: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in after, f"{key} is not exposed"
    return after[key] - before.get(key, 0.0)


def test_a_scrape_exposes_every_named_series_and_no_user(
    sql_url: str, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    config = MemoryConfig(
        data_dir=isolated_config.data_dir,
        storage_class=SQL_STORAGE_CLASS,
        database_url=sql_url,
        llm_base_url=openai_server.base_url,
        llm_api_key=SecretStr("test-key"),
        model_name="test-model",
        max_facts=10,
        llm_timeout_seconds=2,
    )
    set_memory_config(config)
    reset_memory_storage()
    client = TestClient(_app())
    before = _scrape(client)

    storage = get_memory_storage()
    full = {"facts": [{"content": f"filler fact {i}", "confidence": 0.5} for i in range(10)]}
    assert storage.save(full, user_id=USER)
    openai_server.script(REPLY)
    conversation = [
        {"role": "user", "content": "I have an axolotl."},
        {"role": "assistant", "content": "Nice."},
    ]
    assert MemoryUpdater().update_memory(conversation, thread_id="t1", user_id=USER) is True
    assert SECRET_FACT in [fact["content"] for fact in storage.load(user_id=USER)["facts"]]
    openai_server.script(ScriptedError(400, "bad request"))
    assert MemoryUpdater().update_memory(conversation, thread_id="t2", user_id=USER) is False
    then = datetime.now(UTC) - timedelta(seconds=90)
    with get_engine(sql_url).begin() as conn:
        waiting = QueuedConversation("t3", USER, None, conversation, False, False, then)
        queue_table.enqueue(conn, waiting, owner="o", now=then, due_at=then, latest_due_at=then)

    after = _scrape(client)
    assert _grew(before, after, "memstore_storage_operations_total", operation="save", outcome="ok") >= 2
    assert _grew(before, after, "memstore_storage_operations_total", operation="load", outcome="ok") >= 2
    assert _grew(before, after, "memstore_storage_operation_seconds_count", operation="save") >= 2
    assert _grew(before, after, "memstore_llm_calls_total", outcome="ok") == 1
    assert _grew(before, after, "memstore_llm_calls_total", outcome="error") == 1
    assert _grew(before, after, "memstore_llm_call_seconds_count") == 2
    assert _grew(before, after, "memstore_extractions_total", outcome="updated") == 1
    assert _grew(before, after, "memstore_extractions_total", outcome="failed") == 1
    assert _grew(before, after, "memstore_facts_evicted_total") == 1  # the 11th fact pushed one out
    assert after[("memstore_queue_pending", ())] == 1
    assert after[("memstore_queue_leased", ())] == 0 and after[("memstore_queue_dead", ())] == 0
    assert 80 <= after[("memstore_queue_oldest_pending_seconds", ())] < 3600


def _app() -> FastAPI:
    app = FastAPI()
    app.include_router(create_metrics_router())
    return app
