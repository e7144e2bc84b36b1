"""The durable queue's rules, on SQLite and PostgreSQL: coalescing, claims, the lease fence.

Rows are read back with plain SQL, so each test shows what a DBA would see. The updater is the
real ``MemoryUpdater`` with the rules extractor (no LLM needed for these rules); the acceptance
suite (``tests/reliability/test_durable_queue*.py``) runs the LLM path, crashes and outages.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, func, select, text

from memstore.capture.conversation import ConversationContext
from memstore.cli import main
from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import LeaseLostError
from memstore.queries import erase_user
from memstore.queue import DatabaseUpdateQueue, get_memory_queue, reset_memory_queue
from memstore.queue.enqueue import enqueue_engine
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.queue import claims as queue_claims
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.table import QueuedConversation, ScopeClaim
from memstore.storage.sql.schema.models import claims_table
from memstore.update.updater import MemoryUpdater


def _turn(text_: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text_}, {"role": "assistant", "content": "Noted."}]


@pytest.fixture
def configured(sql_url: str, tmp_path: Path) -> Iterator[MemoryConfig]:
    config = MemoryConfig(
        data_dir=str(tmp_path / "data"), database_url=sql_url, extractor="rules", queue_workers=0
    )
    set_memory_config(config)
    reset_memory_storage()
    reset_memory_queue()
    yield config
    reset_memory_queue()


@pytest.fixture
def engine(configured: MemoryConfig, sql_url: str) -> Engine:
    get_memory_storage()  # the embedded SQLite file gets its schema from the first store built on it
    return get_engine(sql_url)


def _rows(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT * FROM memory_queue ORDER BY id")))


def _facts(user_id: str) -> list[str]:
    return sorted(fact["content"] for fact in get_memory_storage().load(user_id=user_id)["facts"])


def test_the_sql_provider_gets_the_database_queue(configured: MemoryConfig) -> None:
    assert isinstance(get_memory_queue(), DatabaseUpdateQueue)


def test_repeated_turns_coalesce_into_one_row_with_sticky_flags(
    configured: MemoryConfig, engine: Engine
) -> None:
    queue = get_memory_queue()
    queue.add("t1", _turn("I prefer green tea."), user_id="alice", correction_detected=True)
    queue.add("t1", _turn("I prefer black coffee."), user_id="alice")
    queue.add("t2", _turn("I prefer rain."), user_id="alice")

    rows = _rows(engine)
    assert [(row.thread_id, row.generation) for row in rows] == [("t1", 2), ("t2", 1)]
    assert bool(rows[0].correction_detected), "a later turn must not erase an earlier correction hint"
    assert "black coffee" in str(rows[0].messages) and "green tea" not in str(rows[0].messages)
    assert rows[0].agent_name == "" and rows[0].user_id == "alice"
    assert queue.pending_count == 2

    queue.flush()

    assert queue.pending_count == 0
    assert {row.state for row in _rows(engine)} == {"done"}
    assert all(_json(row.messages) == [] for row in _rows(engine)), "done rows keep no conversation text"
    assert _facts("alice") == ["User prefers black coffee", "User prefers rain"]


def test_debouncing_never_defers_a_busy_conversation_past_twice_the_debounce(
    configured: MemoryConfig, engine: Engine
) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    item = QueuedConversation("t", "alice", None, _turn("x"), False, False, start)
    with engine.begin() as conn:
        for second in range(0, 100, 10):  # a turn every 10 s, debounce 30 s
            now = start + timedelta(seconds=second)
            queue_table.enqueue(
                conn,
                item,
                owner="o",
                now=now,
                due_at=now + timedelta(seconds=30),
                latest_due_at=now + timedelta(seconds=60),
            )
    [row] = _rows(engine)
    assert _utc(row.due_at) == start + timedelta(seconds=60)
    assert _utc(row.pending_since) == start


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _utc(value: Any) -> datetime:
    parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _claim(engine: Engine, owner: str, now: datetime, lease: float = 30.0) -> ScopeClaim | None:
    with engine.connect() as conn:
        conn.execution_options(**queue_table.write_options(5000))
        with conn.begin():
            return queue_claims.claim(conn, owner=owner, now=now, lease_seconds=lease)


def test_one_claim_per_scope_until_it_expires(configured: MemoryConfig, engine: Engine) -> None:
    queue = get_memory_queue()
    queue.add_nowait("t1", _turn("I prefer tea."), user_id="alice")
    queue.add_nowait("t2", _turn("I prefer jazz."), user_id="alice")
    queue.add_nowait("t3", _turn("I prefer cats."), user_id="bob")
    now = datetime.now(UTC) + timedelta(seconds=1)

    first = _claim(engine, "A", now)
    second = _claim(engine, "B", now)
    third = _claim(engine, "C", now)

    assert first is not None and second is not None
    assert {(first.user_id, len(first.conversations)), (second.user_id, len(second.conversations))} == {
        ("alice", 2),
        ("bob", 1),
    }, "a claim takes the scope's due conversations of every thread"
    assert third is None, "both scopes are held: nothing is left to claim"

    later = now + timedelta(seconds=31)
    taken = _claim(engine, "D", later)
    assert taken is not None and taken.token not in (first.token, second.token)
    assert {leased.lease.row_id for leased in taken.conversations} <= {
        leased.lease.row_id for leased in first.conversations + second.conversations
    }


def test_a_taken_over_worker_cannot_commit_and_the_update_lands_once(
    configured: MemoryConfig, engine: Engine
) -> None:
    queue = get_memory_queue()
    queue.add_nowait("t1", _turn("I prefer green tea."), user_id="alice")
    now = datetime.now(UTC) + timedelta(seconds=1)
    stale = _claim(engine, "A", now, lease=1.0)
    assert stale is not None
    fresh = _claim(engine, "B", now + timedelta(seconds=2))
    assert fresh is not None
    [old] = stale.conversations
    [new] = fresh.conversations
    context = ConversationContext(
        "t1", old.conversation.messages, None, "alice", timestamp=old.conversation.captured_at
    )

    with pytest.raises(LeaseLostError):
        MemoryUpdater().process(context, old.lease)
    assert _facts("alice") == [], "the rolled-back save wrote nothing"

    assert MemoryUpdater().process(context, new.lease) is True
    assert _facts("alice") == ["User prefers green tea"]
    [row] = _rows(engine)
    assert row.state == "done" and row.lease_token is None
    with engine.connect() as conn:
        history = conn.execute(text("SELECT count(*) FROM memory_history WHERE entity = 'fact'")).scalar_one()
    assert history == 1


def test_a_worker_whose_claim_was_taken_over_settles_no_row_of_the_scope(
    configured: MemoryConfig, engine: Engine
) -> None:
    queue = get_memory_queue()
    queue.add_nowait("t1", _turn("I prefer green tea."), user_id="alice")
    queue.add_nowait("t2", _turn("I prefer jazz."), user_id="alice")
    now = datetime.now(UTC) + timedelta(seconds=1)
    stale = _claim(engine, "A", now, lease=1.0)
    assert stale is not None and len(stale.conversations) == 2
    first, second = stale.conversations
    with engine.connect() as conn:  # the next claim takes the scope but leaves t2's row alone
        conn.execution_options(**queue_table.write_options(5000))
        with conn.begin():
            fresh = queue_claims.claim(
                conn,
                owner="B",
                now=now + timedelta(seconds=2),
                lease_seconds=30.0,
                exclude=[second.lease.row_id],
            )
    assert fresh is not None and [c.lease.row_id for c in fresh.conversations] == [first.lease.row_id]
    context = ConversationContext("t2", second.conversation.messages, None, "alice")

    with pytest.raises(LeaseLostError):
        MemoryUpdater().process(context, second.lease)
    with engine.begin() as conn:
        retried = queue_table.reschedule(
            conn,
            second.lease,
            now=datetime.now(UTC),
            due_at=datetime.now(UTC),
            error="x",
            permanent=True,
            dead=True,
        )
    assert not retried, "the claim is B's now: A settles nothing in its scope"
    assert _facts("alice") == []
    states = {row.thread_id: (row.state, row.lease_owner) for row in _rows(engine)}
    assert states["t1"] == ("leased", "B") and states["t2"][0] != "dead"


def test_a_turn_arriving_while_leased_runs_after_the_running_generation(
    configured: MemoryConfig, engine: Engine
) -> None:
    queue = get_memory_queue()
    queue.add_nowait("t1", _turn("I prefer tea."), user_id="alice")
    claim = _claim(engine, "A", datetime.now(UTC) + timedelta(seconds=1))
    assert claim is not None
    queue.add_nowait("t1", _turn("I prefer tea. I prefer chess."), user_id="alice")
    [leased] = claim.conversations
    context = ConversationContext("t1", leased.conversation.messages, None, "alice")

    assert MemoryUpdater().process(context, leased.lease) is True

    [row] = _rows(engine)
    assert row.state == "pending" and row.generation == 2 and "chess" in str(row.messages)
    with engine.begin() as conn:
        queue_table.release(conn, claim.token, now=datetime.now(UTC))
    queue.flush()
    assert _facts("alice") == ["User prefers chess", "User prefers tea"]
    assert [row.state for row in _rows(engine)] == ["done"]


def test_flush_runs_only_this_process_queue(configured: MemoryConfig, sql_url: str, engine: Engine) -> None:
    ours = get_memory_queue()
    other = DatabaseUpdateQueue(sql_url, workers=0)
    try:
        ours.add("t1", _turn("I prefer tea."), user_id="alice")
        other.add("t2", _turn("I prefer jazz."), user_id="bob")

        ours.flush()

        assert _facts("alice") == ["User prefers tea"] and _facts("bob") == []
        assert ours.pending_count == 0 and other.pending_count == 1, "each counts what it queued"
    finally:
        other.close()


def test_shutdown_gives_back_what_it_could_not_finish(
    configured: MemoryConfig, sql_url: str, engine: Engine
) -> None:
    gate = threading.Event()
    started = threading.Event()

    class Slow:
        def process(self, context: ConversationContext, lease: Any = None) -> bool:
            started.set()
            gate.wait(10)
            return MemoryUpdater().process(context, lease)

    queue = DatabaseUpdateQueue(sql_url, lambda: Slow(), workers=1)
    queue.add_nowait("t1", _turn("I prefer tea."), user_id="alice")
    assert started.wait(10)

    assert queue.shutdown(timeout=0.2) is True
    [row] = _rows(engine)
    assert row.state == "pending" and row.lease_token is None and row.attempts == 0
    with engine.connect() as conn:
        live = claims_table.c.lease_expires_at >= datetime.now(UTC)
        assert conn.execute(select(func.count()).select_from(claims_table).where(live)).scalar_one() == 0
    queue.add("t9", _turn("I prefer late."), user_id="bob")
    assert len(_rows(engine)) == 1, "a shut-down queue takes no new turns"

    claim = _claim(engine, "next-worker", datetime.now(UTC) + timedelta(seconds=1))
    assert claim is not None and len(claim.conversations) == 1, "the next worker takes it at once"
    gate.set()  # the released worker's save now fails the fence instead of landing twice
    [leased] = claim.conversations
    context = ConversationContext("t1", leased.conversation.messages, None, "alice")
    assert MemoryUpdater().process(context, leased.lease) is True
    assert _facts("alice") == ["User prefers tea"]


def test_erase_deletes_queued_conversations(configured: MemoryConfig, engine: Engine) -> None:
    queue = get_memory_queue()
    queue.add("t1", _turn("I prefer tea."), user_id="alice")
    queue.add("t2", _turn("I prefer jazz."), user_id="bob")
    get_memory_storage().save({"facts": [{"content": "seed", "confidence": 0.9}]}, user_id="alice")

    counts = erase_user("alice")

    assert counts["memory_queue"] == 1
    assert [row.user_id for row in _rows(engine)] == ["bob"]


def test_a_dead_conversation_is_shown_retried_and_purged(configured: MemoryConfig, engine: Engine) -> None:
    queue = get_memory_queue()
    queue.add("t1", _turn("I prefer tea."), user_id="alice")
    queue.add("t2", _turn("I prefer jazz."), user_id="bob")
    with engine.begin() as conn:
        conn.execute(text("UPDATE memory_queue SET state = 'dead', attempts = 10, last_error = 'boom'"))
    runner = CliRunner()

    status = runner.invoke(main, ["queue", "status", "--json"])
    assert status.exit_code == 0, status.output
    assert '"dead": 2' in status.output and '"last_error": "boom"' in status.output

    first = _rows(engine)[0]
    retried = runner.invoke(main, ["queue", "retry", str(first.id)])
    assert retried.exit_code == 0 and "1 dead conversation(s) queued again" in retried.output
    assert runner.invoke(main, ["queue", "retry", "99999"]).exit_code == 4
    assert runner.invoke(main, ["queue", "retry"]).exit_code == 2

    queue.flush()
    assert _facts("alice") == ["User prefers tea"]

    purged = runner.invoke(main, ["queue", "purge", "--all", "--yes"])
    assert purged.exit_code == 0 and "1 dead conversation(s) deleted" in purged.output
    assert [row.thread_id for row in _rows(engine)] == ["t1"]


def test_the_request_path_buffers_while_the_database_is_unreachable(tmp_path: Path) -> None:
    """A PostgreSQL port nobody listens on: submit returns, the turn waits in the buffer."""
    url = "postgresql+psycopg://postgres@127.0.0.1:1/none"
    set_memory_config(MemoryConfig(data_dir=str(tmp_path), database_url=url, queue_workers=0))
    queue = DatabaseUpdateQueue(url, workers=0)
    try:
        queue.submit(ConversationContext("t1", _turn("I prefer tea."), None, "alice"))
        queue.submit(ConversationContext("t1", _turn("I prefer coffee."), None, "alice", True))
        queue.submit(ConversationContext("t2", _turn("I prefer jazz."), None, "alice"))
        assert queue.stats.accepted == 3
        assert len(queue._buffer) == 2
    finally:
        assert queue.shutdown(timeout=0.1) is False, "the buffered turns are reported lost"
    assert "connect_timeout=2" in str(enqueue_engine(url, 1.5).url)


def test_sql_provider_and_queue_share_an_engine(configured: MemoryConfig, sql_url: str) -> None:
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage) and storage.engine is get_engine(sql_url)


def test_a_busy_healthy_database_gets_every_turn_and_the_buffer_none(
    configured: MemoryConfig, engine: Engine
) -> None:
    """Concurrent requests wait their turn for a writer; only a stuck writer sends turns to the buffer."""
    queue = get_memory_queue()
    assert isinstance(queue, DatabaseUpdateQueue)

    def requests(user: int) -> None:
        for turn in range(5):
            queue.add(f"t{turn}", _turn(f"I prefer item {user}-{turn}."), user_id=f"u{user}")

    threads = [threading.Thread(target=requests, args=(user,)) for user in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert len(queue._buffer) == 0
    assert len(_rows(engine)) == 40 and queue.stats.accepted == 40


def test_the_same_turn_written_twice_runs_once(configured: MemoryConfig, engine: Engine) -> None:
    """A write that outlived the request's wait can land after its buffered copy was written."""
    queue = get_memory_queue()
    context = ConversationContext("t1", _turn("I prefer tea."), None, "alice")
    queue.submit(context, immediately=True)
    queue.flush()
    queue.submit(context, immediately=True)  # the same capture again

    [row] = _rows(engine)
    assert (row.state, row.generation) == ("done", 1)
    later = ConversationContext(
        "t1",
        _turn("I prefer tea. I prefer chess."),
        None,
        "alice",
        timestamp=context.timestamp + timedelta(seconds=1),
    )
    queue.submit(later)
    [row] = _rows(engine)
    assert (row.state, row.generation) == ("pending", 2), "a newer turn reopens it"


def test_queue_retry_gives_a_dead_conversation_a_full_set_of_tries(
    configured: MemoryConfig, engine: Engine
) -> None:
    get_memory_queue().add("t1", _turn("I prefer tea."), user_id="alice")
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE memory_queue SET state = 'dead', attempts = 10, failures = 10, "
                "not_before = due_at, last_error = 'boom'"
            )
        )
    assert CliRunner().invoke(main, ["queue", "retry", "--all"]).exit_code == 0
    [row] = _rows(engine)
    assert (row.state, row.attempts, row.failures, row.not_before) == ("pending", 0, 0, None)


def test_a_capture_time_in_another_zone_is_queued_as_utc(configured: MemoryConfig, engine: Engine) -> None:
    plus_two = timezone(timedelta(hours=2))
    captured = datetime.now(plus_two)
    get_memory_queue().submit(
        ConversationContext("t1", _turn("I prefer tea."), None, "alice", timestamp=captured)
    )
    [row] = _rows(engine)
    assert abs(_utc(row.captured_at) - captured) < timedelta(milliseconds=1), (
        "the instant, not the wall clock"
    )
