"""A replica whose database goes down: ``/readyz`` and the memory API answer 503, with no secret.

The API's 503 is logged once, at WARNING, with the caller and the cause (the server log
showed only the access line before). Workers that stop are not an outage of the API: it stays
ready while the queue's lag grows, and says so in the body (issue 30 item 13).
"""

from __future__ import annotations

import logging
import time

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig, set_memory_config
from memstore.integrations.fastapi import create_memory_router
from memstore.integrations.health import create_health_router
from memstore.queue import DatabaseUpdateQueue
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from tests.support.pg_cluster import PgCluster

pytestmark = pytest.mark.postgres


def test_a_database_that_went_down_is_not_ready_and_the_answer_shows_no_secret(
    cluster: PgCluster, outage_url: str, caplog: pytest.LogCaptureFixture, isolated_config: MemoryConfig
) -> None:
    # The private cluster trusts every login, so the password is there only to be kept secret.
    url = make_url(outage_url).set(password="s3cret-pw").render_as_string(hide_password=False)
    app = FastAPI()
    storage = SqlMemoryStorage(url)
    app.include_router(create_health_router(storage))
    app.include_router(create_memory_router(lambda: "alice"))
    set_memory_config(MemoryConfig(data_dir=isolated_config.data_dir, database_url=url))
    reset_memory_storage()
    client = TestClient(app)
    assert client.get("/readyz").status_code == 200
    assert client.get("/api/memory").status_code == 200
    cluster.stop()
    with caplog.at_level(logging.WARNING, logger="memstore.ops.health"):
        answer = client.get("/readyz")
    assert client.get("/healthz").json() == {"status": "ok"}  # the process still answers
    assert answer.status_code == 503
    assert answer.json() == {
        "status": "not ready",
        "checks": [{"name": "database", "ok": False, "detail": "unreachable"}],
    }
    assert "s3cret-pw" not in answer.text and "s3cret-pw" not in caplog.text
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert "cannot reach the database at postgresql+psycopg://postgres:***@" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memstore.integrations"):
        refused = client.get("/api/memory")
    assert refused.status_code == 503
    assert refused.json() == {"detail": "Memory storage is unavailable; try again later."}
    [record] = [r for r in caplog.records if r.name == "memstore.integrations.fastapi_errors"]
    assert record.levelno == logging.WARNING
    assert "user alice answered 503" in record.getMessage() and "postgres:***@" in record.getMessage()
    assert "s3cret-pw" not in caplog.text


def test_stopped_workers_leave_the_api_ready_and_only_the_database_takes_it_out(
    cluster: PgCluster, outage_url: str, isolated_config: MemoryConfig
) -> None:
    """compose's API health check is /readyz: a worker that is down must not mark the API unhealthy."""
    set_memory_config(
        MemoryConfig(
            data_dir=isolated_config.data_dir,
            database_url=outage_url,
            queue_workers=0,  # the gateway only enqueues; its `memstore worker` is down
            ready_max_queue_lag_seconds=1,
        )
    )
    reset_memory_storage()
    gateway = DatabaseUpdateQueue(outage_url, workers=0)
    turn = [{"role": "user", "content": "I work at Acme."}, {"role": "assistant", "content": "Ok."}]
    gateway.submit(ConversationContext("t1", turn, None, "alice"), immediately=True)
    gateway.shutdown(5)
    app = FastAPI()
    app.include_router(create_health_router(SqlMemoryStorage(outage_url)))
    client = TestClient(app)
    time.sleep(1.5)  # past the lag limit: nobody runs the queue

    lagging = client.get("/readyz")
    assert lagging.status_code == 200, lagging.text
    assert lagging.json()["status"] == "ready"
    assert lagging.json()["queue"]["ok"] is False
    assert lagging.json()["queue"]["detail"].startswith("oldest waiting turn ")

    cluster.stop()
    down = client.get("/readyz")
    assert down.status_code == 503
    assert down.json() == {
        "status": "not ready",
        "checks": [{"name": "database", "ok": False, "detail": "unreachable"}],
    }
