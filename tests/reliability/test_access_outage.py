"""Access counts survive a database outage: a failed flush keeps them and warns once.

Runs against a private cluster (tests/support/pg_cluster.py) that the test stops and restarts.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from memstore.document import create_empty_memory
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.documents import access as access_module
from tests.support.pg_cluster import PgCluster

pytestmark = pytest.mark.postgres


def _doc(*fact_ids: str) -> dict[str, Any]:
    doc = create_empty_memory()
    doc["facts"] = [
        {"id": fact_id, "content": f"content of {fact_id}", "category": "context", "confidence": 0.8}
        for fact_id in fact_ids
    ]
    return doc


def test_a_flush_during_an_outage_keeps_the_counts_and_warns_once(
    cluster: PgCluster, outage_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    storage = SqlMemoryStorage(outage_url)
    assert storage.save(_doc("fact_00000001", "fact_00000002"), user_id="alice")
    storage.record_access(None, user_id="alice", fact_ids=["fact_00000001", "fact_00000002"])

    cluster.stop()
    with caplog.at_level(logging.DEBUG, logger=access_module.__name__):
        assert storage.flush_access() == 0
        storage.record_access(None, user_id="alice", fact_ids=["fact_00000001"])
        assert storage.flush_access() == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "kept for the next flush" in warnings[0].getMessage()

    cluster.start()
    assert storage.flush_access() == 2
    signals = storage.fact_signals(user_id="alice")
    assert signals["fact_00000001"].access_count == 2
    assert signals["fact_00000002"].access_count == 1
    assert storage.load(user_id="alice")["revision"] == 1
