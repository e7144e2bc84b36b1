"""The seed DeerFlow adapter keeps a save that meets a real outage and replays it, merged, afterwards.

DeerFlow's updater turns a failed save into ``False`` and never retries; the adapter's replay
buffer is what keeps the update. The outage is a private PostgreSQL cluster, stopped for real.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest

from memstore.errors import StorageUnavailableError
from memstore.integrations.deerflow import SeedStore
from tests.support.pg_cluster import PgCluster

pytestmark = pytest.mark.postgres


def _fact(content: str) -> dict[str, Any]:
    return {
        "id": f"fact_{uuid.uuid4().hex[:8]}",
        "content": content,
        "category": "knowledge",
        "confidence": 0.9,
        "createdAt": "2026-01-01T00:00:00Z",
        "source": "thread-1",
    }


def test_a_save_during_an_outage_is_replayed_merged_when_the_database_returns(
    cluster: PgCluster, outage_url: str
) -> None:
    gateway, other_replica = SeedStore(database_url=outage_url), SeedStore(database_url=outage_url)
    assert gateway.save({"facts": [_fact("Base")]} | {"user": {}, "history": {}}, user_id="alice")
    loaded = copy.deepcopy(gateway.load(user_id="alice"))  # the updater's load, before the LLM call
    cluster.stop()
    loaded["facts"].append(_fact("Learned during the outage"))
    assert gateway.save(loaded, user_id="alice") is False  # not durable: DeerFlow must not say saved
    assert gateway.pending_replays == 1
    with pytest.raises(StorageUnavailableError):
        gateway.load(user_id="alice")
    cluster.start()
    other = copy.deepcopy(other_replica.load(user_id="alice"))
    other["facts"].append(_fact("Written by another replica meanwhile"))
    assert other_replica.save(other, user_id="alice")
    assert gateway.replay_pending() == 0
    contents = {fact["content"] for fact in gateway.reload(user_id="alice")["facts"]}
    assert contents == {"Base", "Learned during the outage", "Written by another replica meanwhile"}
