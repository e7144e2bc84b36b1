"""memstore behind PgBouncer in transaction pooling mode (issue 36), in ``make test``'s direct pass.

The throwaway pooler of scripts/with-pgbouncer.sh (``pool_mode = transaction``) hands each
transaction whichever server connection is free, so nothing may live on a server connection
between transactions: not an identity, a timeout, an advisory lock, nor a prepared statement.
The contract, queue and isolation suites run again through the same pooler in the second pass
(``MEMSTORE_TEST_THROUGH_PGBOUNCER``); this module proves what that pass takes for granted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

import memstore
from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import ConfigError
from memstore.queue import DatabaseUpdateQueue
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.schema.migrate import current, head, upgrade
from tests.support.app_role import app_role_url
from tests.support.faces import Face
from tests.support.postgres import fresh_database, pgbouncer_url_or_skip

pytestmark = pytest.mark.postgres
POOL_SIZE = 10
"""scripts/with-pgbouncer.sh's ``default_pool_size``: the server connections one database and role share."""


@pytest.fixture
def direct_url(pg_server_url: str) -> Iterator[str]:
    """A fresh, empty database on the server itself (no migration yet)."""
    with fresh_database(pg_server_url) as url:
        yield url
        dispose_engines()


def pooled(url: str, *, threshold: str = "none") -> str:
    """``url``'s database through the test pooler, with ``?prepare_threshold=`` set."""
    bouncer = make_url(pgbouncer_url_or_skip())
    routed = make_url(url).set(host=bouncer.host, port=bouncer.port)
    return routed.update_query_dict({"prepare_threshold": threshold}).render_as_string(hide_password=False)


def _repeat_on_two_server_connections(engine: Engine) -> None:
    """One client connection runs a statement often enough for psycopg to prepare it (each run its own
    transaction, as memstore's are), then runs it again while a second client connection holds the
    only server connection the first one has used, so the pooler hands it another server connection."""
    statement = text("SELECT count(*) FROM pg_catalog.pg_class WHERE relname = :name")
    with engine.connect() as client, engine.connect() as holder:
        for _ in range(8):
            client.execute(statement, {"name": "pg_class"})
            client.commit()
        with holder.begin():
            holder.execute(text("SELECT 1"))
            client.execute(statement, {"name": "pg_class"})
            client.commit()


def test_prepared_statements_break_transaction_pooling_unless_turned_off(direct_url: str) -> None:
    """The reason for ``?prepare_threshold=none``: psycopg's default prepares a statement on the server
    connection it happened to have, and the pooler's next transaction may run on another one."""
    default = get_engine(pooled(direct_url, threshold="5"))
    with pytest.raises(DBAPIError, match=r"prepared statement .* does not exist"):
        _repeat_on_two_server_connections(default)
    safe = get_engine(pooled(direct_url))
    _repeat_on_two_server_connections(safe)
    with safe.connect() as conn:
        assert conn.connection.driver_connection.prepare_threshold is None  # type: ignore[union-attr]


def test_migrations_run_through_the_pooler_once_however_many_start_together(direct_url: str) -> None:
    """``memstore db upgrade`` (and every process's auto-migration) holds a transaction advisory lock,
    never a session one, so it works through a transaction pooler: four at once migrate once."""
    url = pooled(direct_url)
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            upgrade(url)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert current(direct_url) == head()


def _server_state(direct: Engine) -> dict[str, int]:
    """What memstore's sessions left on the server: advisory locks and backends still in a transaction."""
    with direct.connect() as conn:
        locks = conn.execute(
            text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        ).scalar_one()
        idle_in_transaction = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    return {"advisory_locks": int(locks), "idle_in_transaction": int(idle_in_transaction)}


def test_a_request_leaves_no_session_state_on_the_pooled_server_connections(
    face: Face, direct_url: str, tmp_path: Path
) -> None:
    """Identity, timeouts and locks are transaction-local: after memstore's writes and reads through
    the pooler as an application role that row-level security binds (so every transaction sets an
    identity), on both faces, every server connection of that role's pool reads them as unset."""
    upgrade(direct_url)
    with app_role_url(direct_url) as role_url:
        url = pooled(role_url)
        set_memory_config(MemoryConfig(data_dir=str(tmp_path / "data"), database_url=url))
        reset_memory_storage()
        get_memory_storage()
        for user in ("alice", "bob"):
            face.call("create_memory_fact", f"{user} keeps bees", user_id=user, tenant_id="acme")
            facts = face.call("get_memory_data", user_id=user, tenant_id="acme")["facts"]
            assert [fact["content"] for fact in facts] == [f"{user} keeps bees"]
        face.call("clear_memory_data", user_id="bob", tenant_id="acme")

        # Hold as many clients as the pool has server connections: each is lent a different one,
        # so together they are every server connection memstore's transactions ran on.
        probe = create_engine(url, poolclass=NullPool, connect_args={"prepare_threshold": None})
        connections = [probe.connect() for _ in range(POOL_SIZE)]
        try:
            seen = [
                tuple(
                    conn.execute(
                        text(
                            "SELECT current_setting('memstore.tenant_id', true),"
                            " current_setting('memstore.user_id', true),"
                            " current_setting('statement_timeout'), current_setting('lock_timeout'),"
                            " (SELECT count(*) FROM pg_prepared_statements), pg_backend_pid()"
                        )
                    ).one()
                )
                for conn in connections
            ]
        finally:
            for conn in connections:
                conn.close()
            probe.dispose()
        assert len({row[-1] for row in seen}) == POOL_SIZE, "each probe on its own server connection"
        assert {row[:-1] for row in seen} <= {("", "", "0", "0", 0), (None, None, "0", "0", 0)}, seen
        assert _server_state(create_engine(direct_url, poolclass=NullPool)) == {
            "advisory_locks": 0,
            "idle_in_transaction": 0,
        }
        reset_memory_storage()
        dispose_engines()


@pytest.mark.parametrize("value", ["never", "-1", "1e3", "99999999", "%C2%B2"])
def test_a_bad_prepare_threshold_is_a_config_error_naming_the_option(value: str) -> None:
    with pytest.raises(ConfigError, match="prepare_threshold must be 'none' or a whole number"):
        get_engine(f"postgresql://memstore@127.0.0.1:1/memstore?prepare_threshold={value}")


def test_prepare_threshold_is_refused_on_sqlite(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="prepare_threshold is for PostgreSQL"):
        get_engine(f"sqlite:///{tmp_path / 'memory.db'}?prepare_threshold=none")


def test_the_public_api_sets_no_session_state_a_pooler_would_leak(direct_url: str, tmp_path: Path) -> None:
    """The module-level helpers (what a gateway calls) through the pooler, many threads at once: every
    write lands as its own identity though the pooler mixes the server connections under them."""
    upgrade(direct_url)
    set_memory_config(MemoryConfig(data_dir=str(tmp_path / "data"), database_url=pooled(direct_url)))
    reset_memory_storage()
    users = [f"user{index}" for index in range(12)]

    def write(user: str) -> None:
        for turn in range(5):
            memstore.create_memory_fact(f"{user} fact {turn}", user_id=user, tenant_id="acme")

    threads = [threading.Thread(target=write, args=(user,)) for user in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for user in users:
        facts = memstore.get_memory_data(user_id=user, tenant_id="acme")["facts"]
        contents = sorted(fact["content"] for fact in facts)
        assert contents == [f"{user} fact {turn}" for turn in range(5)]
    reset_memory_storage()
    dispose_engines()


def _waiting_on_the_queue(direct: Engine) -> int:
    with direct.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                    "WHERE c.relname = 'memory_queue' AND NOT l.granted"
                )
            ).scalar_one()
        )


def test_the_queue_bounds_its_waits_inside_each_transaction_through_the_pooler(
    direct_url: str, tmp_path: Path
) -> None:
    """PgBouncer refuses a connection's startup ``options`` (or, told to ignore them, drops them), so
    the request path's queue writes bound their lock and statement waits inside each transaction: a
    write stuck behind a lock gives up on the server after ``queue_enqueue_timeout_seconds``."""
    upgrade(direct_url)
    url = pooled(direct_url)
    set_memory_config(
        MemoryConfig(
            data_dir=str(tmp_path / "data"),
            database_url=url,
            queue_workers=0,
            queue_enqueue_timeout_seconds=1.0,
        )
    )
    queue = DatabaseUpdateQueue(url, workers=0)
    direct = create_engine(direct_url, poolclass=NullPool)
    turn = [{"role": "user", "content": "I prefer tea."}, {"role": "assistant", "content": "Noted."}]
    try:
        queue.submit(ConversationContext("t0", turn, None, "alice"))
        assert queue.stats.accepted == 1 and len(queue._buffer) == 0, "written through the pooler"
        with direct.connect() as holder, holder.begin():
            holder.execute(text("LOCK TABLE memory_queue IN ACCESS EXCLUSIVE MODE"))
            queue.submit(ConversationContext("t1", turn, None, "bob"))
            deadline = time.monotonic() + 30
            while _waiting_on_the_queue(direct) == 0 and time.monotonic() < deadline:
                time.sleep(0.05)  # until the write reaches the lock (it may already have given up)
            # The buffer's drain retries the write (bounded too), so a waiter may come and go: what
            # a write without a lock_timeout would never show is a moment with nobody waiting.
            waiting = _waiting_on_the_queue(direct)
            while waiting > 0 and time.monotonic() < deadline:
                time.sleep(0.1)
                waiting = _waiting_on_the_queue(direct)
            assert waiting == 0, "the write still waits: no lock_timeout on it"
        with direct.connect() as conn:
            written = conn.execute(
                text("SELECT count(*) FROM memory_queue WHERE thread_id = 't1'")
            ).scalar_one()
        # Not lost: in the buffer, or written by the drain once the lock went.
        assert len(queue._buffer) + written == 1, "the write that timed out waits in the buffer, not lost"
    finally:
        queue.shutdown(timeout=5)
        direct.dispose()
        dispose_engines()


def test_every_engine_memstore_builds_comes_from_engine_py() -> None:
    """``?prepare_threshold=`` reaches psycopg through ``engine.py``'s builders only: an engine made
    anywhere else would hand libpq the option (or psycopg its text). The pooled pass converts the
    option for the tests' own engines, so this is what keeps memstore's from relying on that."""
    root = Path(__file__).resolve().parents[2] / "memstore"
    builders = ("create_engine(", "create_async_engine(")
    found = {
        str(path.relative_to(root.parent))
        for path in root.rglob("*.py")
        if any(builder in path.read_text(encoding="utf-8") for builder in builders)
    }
    # engine.py builds every database engine; downgrade_plan.py renders DDL on an in-memory SQLite.
    assert found == {"memstore/storage/sql/engine.py", "memstore/storage/sql/schema/downgrade_plan.py"}
