"""``/healthz`` and ``/readyz`` (issue 20): each readiness check fails for its own reason, and says so.

Against real databases: a fresh one at head, one migrated back a revision, and a queue whose
oldest turn has waited too long (reported, never a reason to be unready). A database that goes
down, and workers that stop, are in ``tests/reliability/test_readiness_outage.py``.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from memstore.config import MemoryConfig, set_memory_config
from memstore.integrations.health import create_health_router
from memstore.storage.base import MemoryStorage
from memstore.storage.file import FileMemoryStorage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.table import QueuedConversation
from memstore.storage.sql.schema import migrate


def _client(storage: MemoryStorage) -> TestClient:
    app = FastAPI()
    app.include_router(create_health_router(storage))
    return TestClient(app)


def _checks(body: dict[str, object]) -> dict[str, tuple[bool, str]]:
    checks = body["checks"]
    assert isinstance(checks, list)
    return {check["name"]: (check["ok"], check["detail"]) for check in checks}


def test_a_database_at_head_with_an_idle_queue_is_ready(sql_url: str) -> None:
    client = _client(SqlMemoryStorage(sql_url))
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["status"] == "ready"
    assert _checks(ready.json()) == {
        "database": (True, "reachable"),
        "schema": (True, f"at {migrate.head()}, head is {migrate.head()}"),
    }
    assert ready.json()["queue"] == {"ok": True, "detail": "nothing waiting"}


def test_a_database_behind_head_is_not_ready(sql_url: str, caplog: pytest.LogCaptureFixture) -> None:
    storage = SqlMemoryStorage(sql_url)
    previous = migrate.history()[1].revision
    migrate.downgrade(sql_url, previous)
    with caplog.at_level(logging.WARNING, logger="memstore.ops.health"):
        answer = _client(storage).get("/readyz")
    assert answer.status_code == 503
    assert _checks(answer.json())["schema"] == (False, f"at {previous}, head is {migrate.head()}")
    assert [record.levelno for record in caplog.records] == [logging.WARNING]


def test_a_queue_that_lags_is_reported_but_the_api_stays_ready(
    sql_url: str, isolated_config: MemoryConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """The workers are down: the API can still serve, so it stays in rotation (issue 30 item 13)."""
    set_memory_config(isolated_config.model_copy(update={"ready_max_queue_lag_seconds": 60}))
    storage = SqlMemoryStorage(sql_url)
    turn = [{"role": "user", "content": "I moved to Lisbon"}, {"role": "assistant", "content": "Noted."}]
    then = datetime.now(UTC) - timedelta(minutes=10)
    with get_engine(sql_url).begin() as conn:
        queue_table.enqueue(
            conn,
            QueuedConversation("t", "alice", None, turn, False, False, then),
            owner="o",
            now=then,
            due_at=then,
            latest_due_at=then,
        )
    with caplog.at_level(logging.WARNING, logger="memstore.ops.health"):
        answer = _client(storage).get("/readyz")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "ready" and set(_checks(body)) == {"database", "schema"}
    assert body["queue"]["ok"] is False
    detail = body["queue"]["detail"]
    assert detail.startswith("oldest waiting turn 6") and detail.endswith("limit 60 s")
    [record] = caplog.records  # the lag is still logged, for whoever watches the log
    assert record.levelno == logging.WARNING and "lags" in record.getMessage()


def test_the_file_provider_is_ready_without_a_database(tmp_path: object) -> None:
    answer = _client(FileMemoryStorage(str(tmp_path))).get("/readyz")
    assert answer.status_code == 200
    assert _checks(answer.json()) == {"storage": (True, "FileMemoryStorage keeps no database")}
    assert "queue" not in answer.json()
