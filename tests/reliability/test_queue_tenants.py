"""The queues and tenants (issue 31, items 1 and 6), on SQLite and PostgreSQL.

A queued conversation keeps its tenant from the request to the save, and is saved in that
tenant's memory; one thread in two tenants is two conversations; claims serve the tenant served
least recently first, so a tenant with a backlog of many scopes cannot starve another; and
``queue_tenant_share`` caps one tenant's rows while the others still enqueue. On PostgreSQL the
same runs as an application role that row-level security binds, with the worker on the operator
connection, and a row forged for another tenant is refused by the policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.exc import ProgrammingError

from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import QueueFullError
from memstore.metrics import QUEUE_REJECTED
from memstore.ops.queue import queue_status
from memstore.queue import MemoryUpdateQueue, get_memory_queue, reset_memory_queue
from memstore.queue.bounds import table_limits
from memstore.scope import Identity
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.identity import policies_apply, transaction
from memstore.storage.sql.queue import claims as queue_claims
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.table import QueuedConversation, ScopeClaim
from memstore.storage.sql.schema.models import queue_table as queue_rows
from memstore.update.updater import MemoryUpdater
from tests.support.app_role import app_role_url

TENANTS = ("acme", "globex")


def _turn(text_: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text_}, {"role": "assistant", "content": "Noted."}]


def _configure(url: str, tmp_path: Path, **extra: Any) -> MemoryConfig:
    config = MemoryConfig(
        data_dir=str(tmp_path / "data"), database_url=url, extractor="rules", queue_workers=0, **extra
    )
    set_memory_config(config)
    reset_memory_storage()
    reset_memory_queue()
    get_memory_storage()  # the embedded SQLite file gets its schema from the first store built on it
    return config


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    reset_memory_queue()
    reset_memory_storage()


def _facts(tenant: str, user: str, agent: str | None = None) -> list[str]:
    storage = get_memory_storage().for_identity(tenant)
    return sorted(fact["content"] for fact in storage.reload(agent, user_id=user)["facts"])


def _queued(engine: Engine) -> list[tuple[str, str, str, str, str]]:
    columns = (queue_rows.c.tenant_id, queue_rows.c.thread_id, queue_rows.c.user_id, queue_rows.c.agent_name)
    with engine.connect() as conn:
        rows = conn.execute(select(*columns, queue_rows.c.state).order_by(queue_rows.c.id)).all()
    return [(row[0], row[1], row[2], row[3], row[4]) for row in rows]


def test_a_row_keeps_its_tenant_from_the_request_to_the_save(sql_url: str, tmp_path: Path) -> None:
    _configure(sql_url, tmp_path)
    queue = get_memory_queue()
    queue.add("t1", _turn("I prefer green tea."), user_id="alice", tenant_id="acme")

    assert _queued(get_engine(sql_url)) == [("acme", "t1", "alice", "", "pending")]
    queue.flush()

    assert _queued(get_engine(sql_url)) == [("acme", "t1", "alice", "", "done")]
    assert _facts("acme", "alice") == ["User prefers green tea"]
    assert _facts("default", "alice") == [], "the default tenant's alice is another person"
    assert _facts("globex", "alice") == []


def test_one_thread_in_two_tenants_is_two_conversations_saved_apart(sql_url: str, tmp_path: Path) -> None:
    _configure(sql_url, tmp_path)
    queue = get_memory_queue()
    queue.add("t1", _turn("I prefer green tea."), "bot", "alice", tenant_id="acme")
    queue.add("t1", _turn("I prefer black coffee."), "bot", "alice", tenant_id="globex")
    queue.add("t1", _turn("I prefer rain."), "bot", "alice")  # the default tenant
    queue.add("t1", _turn("I prefer jazz."), "bot", "alice", tenant_id="acme")  # coalesces with acme's

    rows = _queued(get_engine(sql_url))
    assert sorted(rows) == [
        ("acme", "t1", "alice", "bot", "pending"),
        ("default", "t1", "alice", "bot", "pending"),
        ("globex", "t1", "alice", "bot", "pending"),
    ]
    assert queue.pending_count == 3
    queue.flush()

    assert _facts("acme", "alice", "bot") == ["User prefers jazz"]
    assert _facts("globex", "alice", "bot") == ["User prefers black coffee"]
    assert _facts("default", "alice", "bot") == ["User prefers rain"]


def _enqueue(engine: Engine, item: QueuedConversation, now: datetime) -> None:
    with engine.begin() as conn:
        queue_table.enqueue(conn, item, owner="o", now=now, due_at=now, latest_due_at=now)


def _claim(engine: Engine, now: datetime) -> ScopeClaim | None:
    with engine.connect() as conn:
        conn.execution_options(**queue_table.write_options(5000))
        with conn.begin():
            return queue_claims.claim(conn, owner="w", now=now, lease_seconds=30.0)


def test_a_tenant_with_a_backlog_does_not_starve_another(sql_url: str, tmp_path: Path) -> None:
    _configure(sql_url, tmp_path)
    engine = get_engine(sql_url)
    start = datetime.now(UTC) - timedelta(minutes=10)
    # Tenant A: 40 conversations of 40 users, all due before tenant B's one.
    for index in range(40):
        item = QueuedConversation(f"a{index}", f"u{index}", None, _turn("x"), False, False, start, "acme")
        _enqueue(engine, item, start + timedelta(seconds=index))
    _enqueue(
        engine,
        QueuedConversation("b0", "u0", None, _turn("y"), False, False, start, "globex"),
        start + timedelta(minutes=5),
    )
    now = datetime.now(UTC)

    claims = [_claim(engine, now + timedelta(milliseconds=step)) for step in range(3)]

    tenants = [claim.tenant_id if claim else None for claim in claims]
    assert tenants[0] == "acme", "A's rows are older: A goes first"
    assert tenants[1] == "globex", "then the tenant served least recently, whatever A's backlog"
    assert tenants[2] == "acme"
    globex = claims[1]
    assert globex is not None
    [leased] = globex.conversations
    assert leased.conversation.tenant_id == "globex" and leased.lease.tenant_id == "globex"
    assert (leased.conversation.thread_id, leased.conversation.user_id) == ("b0", "u0")


def test_a_released_backlog_takes_turns_with_the_other_tenant(sql_url: str, tmp_path: Path) -> None:
    _configure(sql_url, tmp_path)
    engine = get_engine(sql_url)
    start = datetime.now(UTC) - timedelta(minutes=10)
    for index in range(20):
        item = QueuedConversation(f"a{index}", f"u{index}", None, _turn("x"), False, False, start, "acme")
        _enqueue(engine, item, start)
    for index in range(2):
        item = QueuedConversation(f"b{index}", f"v{index}", None, _turn("y"), False, False, start, "globex")
        _enqueue(engine, item, start + timedelta(minutes=1))
    served: list[str] = []
    for step in range(5):
        claim = _claim(engine, datetime.now(UTC) + timedelta(milliseconds=step))
        assert claim is not None
        served.append(claim.tenant_id)
        with engine.begin() as conn:  # nothing run: the rows go back, the claim row stays as service
            queue_table.release(conn, claim.token, now=datetime.now(UTC))
    assert served[:4] == ["acme", "globex", "acme", "globex"]


def test_the_tenant_share_refuses_one_tenant_while_another_enqueues(sql_url: str, tmp_path: Path) -> None:
    _configure(sql_url, tmp_path, max_queue_depth=10, queue_tenant_share=0.5, queue_user_share=1.0)
    queue = get_memory_queue()
    before = QUEUE_REJECTED.labels("tenant_share")._value.get()
    for index in range(6):
        queue.add(f"t{index}", _turn(f"I prefer tea {index}."), user_id=f"u{index}", tenant_id="acme")
    queue.add("t0", _turn("I prefer tea, still."), user_id="u0", tenant_id="acme")  # a newer turn: admitted
    for index in range(3):
        queue.add(f"t{index}", _turn(f"I prefer rain {index}."), user_id=f"u{index}", tenant_id="globex")

    stats = queue.stats
    assert stats.rejected_tenant_share == 1 and stats.rejected_full == 0
    assert stats.accepted == 5 + 1 + 3
    assert QUEUE_REJECTED.labels("tenant_share")._value.get() == before + 1
    rows = _queued(get_engine(sql_url))
    assert sum(1 for row in rows if row[0] == "acme") == 5
    assert sum(1 for row in rows if row[0] == "globex") == 3
    status = queue_status()
    assert (status.tenants_at_share, status.users_at_share) == (1, 0)

    config = MemoryConfig(max_queue_depth=10, queue_tenant_share=0.5)
    now = datetime.now(UTC)
    refused = QueuedConversation("t9", "u9", None, _turn("z"), False, False, now, "acme")
    with pytest.raises(QueueFullError) as caught, get_engine(sql_url).begin() as conn:
        queue_table.enqueue(
            conn, refused, owner="o", now=now, due_at=now, latest_due_at=now, limits=table_limits(config)
        )
    assert caught.value.kind == "tenant_share"


def test_the_default_share_caps_no_tenant_beyond_the_totals() -> None:
    assert table_limits(MemoryConfig()).tenant is None
    limits = table_limits(MemoryConfig(max_queue_depth=100, queue_tenant_share=0.25))
    assert limits.tenant is not None
    assert (limits.tenant.depth, limits.tenant.depth_corrections) == (25, 27)
    tenant = table_limits(MemoryConfig(max_queue_chars=1_000_000, queue_tenant_share=0.25)).tenant
    assert tenant is not None and tenant.chars == 250_000


def test_the_memory_queue_keys_by_tenant_and_saves_into_each(sql_url: str, tmp_path: Path) -> None:
    _configure(sql_url, tmp_path, queue_backend="memory")
    queue = MemoryUpdateQueue(MemoryUpdater)
    try:
        queue.add("t1", _turn("I prefer green tea."), user_id="alice", tenant_id="acme")
        queue.add("t1", _turn("I prefer black coffee."), user_id="alice", tenant_id="globex")
        assert queue.pending_count == 2
        queue.flush()
    finally:
        queue.close()
    assert _facts("acme", "alice") == ["User prefers green tea"]
    assert _facts("globex", "alice") == ["User prefers black coffee"]


# --- PostgreSQL: an application role bound by row-level security ---------------------------------


@pytest.fixture
def app_url(postgres_url: str) -> Iterator[str]:
    """The migrated database as a new application role, which the policies bind (dropped after)."""
    with app_role_url(postgres_url, "memstore_q") as url:
        try:
            yield url
        finally:
            reset_memory_queue()
            reset_memory_storage()


@pytest.mark.postgres
def test_under_row_level_security_rows_are_written_as_their_identity_and_run_by_the_operator(
    app_url: str, postgres_url: str, tmp_path: Path
) -> None:
    _configure(app_url, tmp_path, operator_database_url=postgres_url, max_queue_depth=3, queue_user_share=1.0)
    app = get_engine(app_url)
    assert policies_apply(app)
    queue = get_memory_queue()
    queue.add("t1", _turn("I prefer green tea."), user_id="alice", tenant_id="acme")
    queue.add("t1", _turn("I prefer black coffee."), user_id="alice", tenant_id="globex")
    queue.add("t2", _turn("I prefer rain."), tenant_id="globex")  # no user: '' in the policy
    queue.add("t3", _turn("I prefer snow."), user_id="bob", tenant_id="acme")  # past the total of 3

    # The bounds counted every tenant's rows (through the operator), not only the writer's own.
    assert queue.stats.rejected_full == 1 and queue.stats.accepted == 3
    with transaction(app, Identity("acme", "alice")) as conn:  # the app role sees its own rows only
        assert conn.execute(select(queue_rows.c.thread_id, queue_rows.c.tenant_id)).all() == [("t1", "acme")]
    forged = QueuedConversation("t9", "alice", None, _turn("z"), False, False, datetime.now(UTC), "globex")
    with (
        pytest.raises(ProgrammingError, match="row-level security"),
        transaction(app, Identity("acme", "alice")) as conn,
    ):
        queue_table.enqueue(
            conn,
            forged,
            owner="o",
            now=datetime.now(UTC),
            due_at=datetime.now(UTC),
            latest_due_at=datetime.now(UTC),
        )

    queue.flush()  # claims on the operator connection; each save as its row's identity

    assert {row[4] for row in _queued(get_engine(postgres_url))} == {"done"}
    assert _facts("acme", "alice") == ["User prefers green tea"]
    assert _facts("globex", "alice") == ["User prefers black coffee"]
    storage = get_memory_storage().for_identity("globex")
    assert [fact["content"] for fact in storage.reload(None, user_id=None)["facts"]] == ["User prefers rain"]
