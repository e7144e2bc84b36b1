"""``/readyz`` when the database goes down under a running replica: 503, and no secret in the answer."""

from __future__ import annotations

import logging

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from memstore.integrations.health import create_health_router
from memstore.storage.sql import SqlMemoryStorage
from tests.support.pg_cluster import PgCluster

pytestmark = pytest.mark.postgres


def test_a_database_that_went_down_is_not_ready_and_the_answer_shows_no_secret(
    cluster: PgCluster, outage_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The private cluster trusts every login, so the password is there only to be kept secret.
    url = make_url(outage_url).set(password="s3cret-pw").render_as_string(hide_password=False)
    app = FastAPI()
    app.include_router(create_health_router(SqlMemoryStorage(url)))
    client = TestClient(app)
    assert client.get("/readyz").status_code == 200
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
