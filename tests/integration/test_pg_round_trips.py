"""A PostgreSQL cold load is one round trip, and a connection the server killed costs no error (issue 37).

Counted, not timed: libpq's own protocol trace (``PQtrace``, through psycopg) records every
message the client sends. Each simple ``Query`` and each extended-protocol ``Sync`` is one
request the client waits on, so their number is the number of round trips. The pool sends no
pre-ping: a connection the server closed is noticed at checkout without a round trip, and one
that dies after it costs a read, or a save not yet committing, one more try
(``documents/retry.py``). The kills are real: ``pg_terminate_backend`` from another connection.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, event, text

from memstore.errors import StorageUnavailableError
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, get_engine

pytestmark = pytest.mark.postgres


def _requests(trace: Path) -> int:
    """Client requests in the trace so far: simple queries and extended-protocol syncs."""
    lines = trace.read_text(encoding="utf-8", errors="replace").splitlines()
    return sum(1 for line in lines if line.startswith(("F\t", "F ")) and line.split()[2] in {"Query", "Sync"})


def _document(count: int) -> dict[str, Any]:
    return {
        "facts": [
            {"id": f"fact_{i:08x}", "content": f"fact number {i}", "category": "context", "confidence": 0.9}
            for i in range(count)
        ]
    }


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


def test_a_cold_load_is_one_round_trip(traced: tuple[SqlMemoryStorage, Path]) -> None:
    storage, trace = traced
    assert storage.save(_document(100), user_id="alice")
    storage.reload(user_id="alice")  # the connection exists
    before = _requests(trace)
    loaded = storage.reload(user_id="alice")
    assert len(loaded["facts"]) == 100
    assert _requests(trace) - before == 1  # the statement: no pre-ping, no BEGIN, no ROLLBACK


def test_a_cold_load_from_the_rows_is_one_round_trip_too(traced: tuple[SqlMemoryStorage, Path]) -> None:
    storage, trace = traced
    assert storage.save(_document(100), user_id="alice")
    with get_engine(storage.engine.url).begin() as conn:  # no snapshot: the rows are read
        conn.execute(text("DELETE FROM memory_scope_snapshots"))
    expected = storage.load(user_id="alice")
    storage.reload(user_id="alice")
    before = _requests(trace)
    assert storage.reload(user_id="alice") == expected
    assert _requests(trace) - before == 1


def _backends(url: str) -> list[int]:
    """The server processes of every other connection to the test's database."""
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        return [
            int(row[0])
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ]


def _kill(url: str, pid: int) -> None:
    """End a connection's server process the way a restart or an administrator does, and wait for it."""
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone() == (True,)


def _state(engine: Engine) -> tuple[int, int, int]:
    """Live facts, audit rows and the scope's revision: what a duplicated or lost save would change."""
    with engine.connect() as conn:
        facts, audit, revision = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM memory_facts WHERE deleted_revision IS NULL), "
                "(SELECT count(*) FROM memory_history), (SELECT max(revision) FROM memory_scopes)"
            )
        ).one()
    return int(facts), int(audit), int(revision)


def _added(storage: SqlMemoryStorage, index: int) -> dict[str, Any]:
    document = storage.load(user_id="alice")
    document["facts"].append(_document(index + 1)["facts"][index])
    return document


def test_pooled_connections_the_server_killed_are_replaced_without_an_error(postgres_url: str) -> None:
    storage = SqlMemoryStorage(postgres_url)
    assert storage.save(_document(3), user_id="alice")
    expected = storage.reload(user_id="alice")
    for pid in _backends(postgres_url):  # the pool's idle connections: a restart, an idle timeout
        _kill(postgres_url, pid)
    assert storage.reload(user_id="alice") == expected
    for pid in _backends(postgres_url):
        _kill(postgres_url, pid)
    before = _state(storage.engine)
    assert storage.save(_added(storage, 3), user_id="alice")
    assert _state(storage.engine) == (before[0] + 1, before[1] + 1, before[2] + 1)


class _KillOnce:
    """Kills the server process of the next connection checked out, after the pool's own check:
    the first statement then finds it gone, as when a connection dies in between."""

    def __init__(self, engine: Engine, url: str) -> None:
        self.url, self.killed = url, 0
        event.listen(engine.pool, "checkout", self)

    def __call__(self, _dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if not self.killed:
            self.killed += 1
            _kill(self.url, record.driver_connection.info.backend_pid)


def test_a_load_whose_connection_died_after_the_checkout_is_read_again(postgres_url: str) -> None:
    storage = SqlMemoryStorage(postgres_url)
    assert storage.save(_document(3), user_id="alice")
    expected = storage.reload(user_id="alice")
    killer = _KillOnce(get_engine(postgres_url), postgres_url)
    assert storage.reload(user_id="alice") == expected
    assert killer.killed == 1


def test_a_save_whose_connection_died_after_the_checkout_is_written_once(postgres_url: str) -> None:
    storage = SqlMemoryStorage(postgres_url)
    assert storage.save(_document(3), user_id="alice")
    before = _state(storage.engine)
    document = _added(storage, 3)
    killer = _KillOnce(get_engine(postgres_url), postgres_url)
    assert storage.save(document, user_id="alice")
    assert killer.killed == 1
    assert _state(storage.engine) == (before[0] + 1, before[1] + 1, before[2] + 1)
    assert [fact["id"] for fact in SqlMemoryStorage(postgres_url).load(user_id="alice")["facts"]] == [
        fact["id"] for fact in document["facts"]
    ]


def test_a_save_whose_connection_died_before_its_commit_is_written_once(postgres_url: str) -> None:
    """Killed after its fact row went out, before the COMMIT: the server rolled it back, so the
    second try writes the fact, its audit row and the revision once."""
    storage = SqlMemoryStorage(postgres_url)
    assert storage.save(_document(3), user_id="alice")
    before = _state(storage.engine)
    document = _added(storage, 3)
    engine = get_engine(postgres_url)
    kills: list[int] = []

    def kill_at_the_audit_row(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("INSERT INTO memory_history") and not kills:
            kills.append(conn.connection.driver_connection.info.backend_pid)
            _kill(postgres_url, kills[0])

    event.listen(engine, "before_cursor_execute", kill_at_the_audit_row)
    try:
        assert storage.save(document, user_id="alice")
    finally:
        event.remove(engine, "before_cursor_execute", kill_at_the_audit_row)
    assert len(kills) == 1
    assert _state(storage.engine) == (before[0] + 1, before[1] + 1, before[2] + 1)


def test_a_save_whose_connection_died_while_committing_is_an_outage_not_a_retry(postgres_url: str) -> None:
    """A COMMIT sent without an answer may have been committed: that is not tried again."""
    storage = SqlMemoryStorage(postgres_url)
    assert storage.save(_document(3), user_id="alice")
    before = _state(storage.engine)
    engine = get_engine(postgres_url)
    kills: list[int] = []

    def kill_at_the_commit(conn: Any) -> None:
        if not kills:
            kills.append(conn.connection.driver_connection.info.backend_pid)
            _kill(postgres_url, kills[0])

    event.listen(engine, "commit", kill_at_the_commit)
    try:
        with pytest.raises(StorageUnavailableError):
            storage.save(_added(storage, 3), user_id="alice")
    finally:
        event.remove(engine, "commit", kill_at_the_commit)
    assert len(kills) == 1
    assert _state(storage.engine) == before  # killed before the COMMIT left: nothing was stored
