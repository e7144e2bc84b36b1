"""A PostgreSQL cold load costs two round trips, the pool's pre-ping included (issue 19).

Counted, not timed: libpq's own protocol trace (``PQtrace``, through psycopg) records every
message the client sends. Each simple ``Query`` and each extended-protocol ``Sync`` is one
request the client waits on, so their number is the number of round trips.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import event

from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, get_engine

pytestmark = pytest.mark.postgres


def _requests(trace: Path) -> int:
    """Client requests in the trace so far: simple queries and extended-protocol syncs."""
    lines = trace.read_text(encoding="utf-8", errors="replace").splitlines()
    return sum(1 for line in lines if line.startswith(("F\t", "F ")) and line.split()[2] in {"Query", "Sync"})


@pytest.fixture
def traced(postgres_url: str, tmp_path: Path) -> Iterator[tuple[SqlMemoryStorage, Path]]:
    """The provider on a fresh database, every connection of its engine traced into one file."""
    trace = tmp_path / "libpq.trace"
    with trace.open("wb") as sink:
        dispose_engines()
        engine = get_engine(postgres_url)

        def on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.pgconn.trace(sink.fileno())
            dbapi_connection.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)

        event.listen(engine, "connect", on_connect)
        storage = SqlMemoryStorage(postgres_url)
        yield storage, trace
        storage.close()
        dispose_engines()


def test_a_cold_load_is_two_round_trips_with_the_pre_ping(traced: tuple[SqlMemoryStorage, Path]) -> None:
    storage, trace = traced
    document = {
        "facts": [
            {"id": f"fact_{i:08x}", "content": f"fact number {i}", "category": "context", "confidence": 0.9}
            for i in range(100)
        ]
    }
    assert storage.save(document, user_id="alice")
    storage.reload(user_id="alice")  # the connection exists and the statement is known
    before = _requests(trace)
    loaded = storage.reload(user_id="alice")
    assert len(loaded["facts"]) == 100
    assert _requests(trace) - before == 2  # the pre-ping (";") and the one UNION statement
