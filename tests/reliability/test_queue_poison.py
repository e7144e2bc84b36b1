"""One user's turns must never stop other users' memory (issue 29).

Each test runs the durable queue on SQLite and PostgreSQL through the real middleware, queue,
updater and a local OpenAI-compatible server: a NUL character, a flood of large corrections, a
backlog that could starve other users, rows that cannot be decoded, a configuration that moves to
another database, ``clear()``, and what the failure paths write to the log.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, insert, select
from sqlalchemy import text as sql_text

from memstore.capture.conversation import ConversationContext
from memstore.errors import InvalidScopeError
from memstore.gateway.middleware import MemoryMiddleware
from memstore.metrics import REGISTRY
from memstore.queue import DatabaseUpdateQueue, get_memory_queue, reset_memory_queue
from memstore.queue.enqueue import queued_conversation
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.queue.limits import stored_message_chars
from memstore.storage.sql.queue.table import QueuedConversation
from memstore.storage.sql.schema.migrate import downgrade, upgrade
from memstore.storage.sql.schema.models import queue_table
from tests.reliability.conftest import Record, configure
from tests.reliability.queue_support import llm_config, queue_rows, stored_facts
from tests.reliability.queue_support import token_reply as remember
from tests.support.openai_server import OpenAIStubServer, ScriptedError


def turn(token: str, extra: str = "") -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"Please remember {token} for later.{extra}"},
        {"role": "assistant", "content": "Noted."},
    ]


@pytest.fixture
def llm(openai_server: OpenAIStubServer) -> OpenAIStubServer:
    openai_server.default_reply = remember
    return openai_server


def settings(sql_url: str, server: OpenAIStubServer, **extra: Any) -> dict[str, Any]:
    return {"database_url": sql_url, "debounce_seconds": 30, **llm_config(server), **extra}


def wait_for(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def facts_of(url: str, user: str) -> list[str]:
    return stored_facts(url, [(user, None)])[(user, None)]


# -- 1. a NUL character ------------------------------------------------------------------------


def test_a_nul_from_one_user_stops_nobody(sql_url: str, llm: OpenAIStubServer, record: Record) -> None:
    configure(**settings(sql_url, llm, queue_workers=0))
    middleware = MemoryMiddleware()
    middleware.after_agent(turn("mallory-1", " hello \x00 world"), thread_id="m", user_id="mallory")
    users = [f"user{index:02d}" for index in range(30)]
    for user in users:
        middleware.after_agent(turn(f"{user}-token"), thread_id=f"t-{user}", user_id=user)
    queue = get_memory_queue()
    assert queue.pending_count == 31, "a turn was held back (in the outage buffer) or dropped"
    queue.flush()
    landed = sum(facts_of(sql_url, user) == [f"fact {user}-token"] for user in users)
    record(tried=30, lost=30 - landed, stats=str(queue.stats))
    assert landed == 30
    assert facts_of(sql_url, "mallory") == ["fact mallory-1"]
    stats = queue.stats
    assert stats.accepted == 31 and stats.rejected_full == stats.rejected_invalid == 0
    assert "\x00" not in str(llm.requests[0]), "the NUL reached the LLM"


def test_a_nul_in_a_thread_id_is_the_caller_s_error(sql_url: str, llm: OpenAIStubServer) -> None:
    configure(**settings(sql_url, llm, queue_workers=0))
    queue = get_memory_queue()
    with pytest.raises(InvalidScopeError, match="thread_id contains NUL"):
        queue.add("thread\x00", turn("x"), user_id="mallory")
    queue.add("thread-ok", turn("ok"), user_id="alice")
    assert queue.pending_count == 1


@pytest.mark.postgres
def test_a_turn_the_database_refuses_is_set_aside_and_the_buffer_moves_on(
    postgres_url: str, llm: OpenAIStubServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A turn written by something that did not normalise it (an older process's buffer): the
    database refuses it, and only it; every other buffered turn is written."""
    config = configure(**settings(postgres_url, llm))
    queue = DatabaseUpdateQueue(postgres_url, workers=0)
    poison = QueuedConversation(
        "m",
        "mallory",
        None,
        [{"role": "user", "content": "SECRET\x00WORDS"}],
        False,
        False,
        datetime.now(UTC),
    )
    good = [queued_conversation(ConversationContext(f"t{i}", turn(f"u{i}"), None, f"u{i}")) for i in range(5)]
    for item in [good[0], poison, *good[1:]]:
        assert queue._buffer.put(item, False, config) is None
    with caplog.at_level(logging.INFO, logger="memstore"):
        assert queue._write_buffer(config) is True, "the buffer kept something"
    assert queue_rows(postgres_url)["pending"] == 5
    assert queue.stats.rejected_invalid == 1
    assert "SECRET" not in caplog.text and "mallory" not in caplog.text
    assert "dropped a conversation" in caplog.text and "refused its content" in caplog.text
    queue.close()


# -- 3. bounds in the table --------------------------------------------------------------------


def test_one_user_s_flood_is_bounded_and_others_are_still_accepted(
    sql_url: str, llm: OpenAIStubServer, record: Record, caplog: pytest.LogCaptureFixture
) -> None:
    configure(**settings(sql_url, llm, queue_workers=0, max_queue_depth=100, max_queue_chars=1_000_000))
    queue = get_memory_queue()
    big = "x" * 63_900
    with caplog.at_level(logging.WARNING, logger="memstore.queue"):
        for index in range(2_000):
            queue.add(f"flood-{index}", turn(f"f{index}", big), user_id="mallory", correction_detected=True)
    for index in range(20):
        queue.add(f"t{index}", turn(f"ok{index}"), user_id=f"user{index}")
    with get_engine(sql_url).connect() as conn:
        rows, chars = conn.execute(
            select(func.count(), func.sum(queue_table.c.message_chars)).where(
                queue_table.c.user_id == "mallory"
            )
        ).one()
        others = conn.execute(select(func.count()).where(queue_table.c.user_id != "mallory")).scalar_one()
    stats = queue.stats
    record(tried=2_000, stored_rows=rows, stored_chars=chars, stats=str(stats))
    # A tenth of each bound: 10 rows, +1 of correction reserve (each message is cut to 8,000
    # characters on the way in, so the 100,000-character share is not what stops them).
    assert rows == 11 and chars <= 100_000
    assert 1 <= len(caplog.records) <= 2, "every refusal was logged"
    assert others == 20 and stats.accepted == 31
    assert stats.rejected_user_share == 1_989
    queue.flush()
    assert all(facts_of(sql_url, f"user{index}") == [f"fact ok{index}"] for index in range(20))


def test_the_total_bound_refuses_new_conversations_but_not_new_turns_of_queued_ones(
    sql_url: str, llm: OpenAIStubServer
) -> None:
    configure(**settings(sql_url, llm, queue_workers=0, max_queue_depth=10, queue_user_share=1.0))
    queue = get_memory_queue()
    for index in range(12):
        queue.add(f"t{index}", turn(f"a{index}"), user_id=f"user{index}")
    assert queue.stats.accepted == 10 and queue.stats.rejected_full == 2
    queue.add("t0", turn("a0-again"), user_id="user0")  # a newer turn of a queued conversation
    queue.add("t99", turn("fix"), user_id="user99", correction_detected=True)  # the reserve
    assert queue.stats.accepted == 12 and queue_rows(sql_url)["pending"] == 11


# -- 4. fairness -------------------------------------------------------------------------------


def test_a_backlog_does_not_starve_another_user(sql_url: str, llm: OpenAIStubServer, record: Record) -> None:
    configure(**settings(sql_url, llm, queue_workers=0, debounce_seconds=1))
    feeder = get_memory_queue()
    for index in range(500):
        feeder.add_nowait(f"a{index}", turn(f"a{index}"), user_id="alice")
    feeder.add_nowait("b", turn("bob-1"), user_id="bob")
    reset_memory_queue()
    # Every conversation due at once: what runs first is then the claims' fairness alone, not how
    # long a loaded machine took to enqueue alice's 500 (her early ones fell due while it did).
    with get_engine(sql_url).begin() as conn:
        conn.execute(queue_table.update().values(due_at=datetime.now(UTC)))
    worker = DatabaseUpdateQueue(sql_url, workers=1)
    try:
        wait_for(lambda: facts_of(sql_url, "bob") == ["fact bob-1"], 60, "bob's conversation")
    finally:
        worker.close()
    # Counted by completion time, not when the poll above saw bob's fact: the worker goes on.
    with get_engine(sql_url).connect() as conn:
        done = queue_table.c.completed_at
        bob_done = conn.execute(select(done).where(queue_table.c.user_id == "bob")).scalar_one()
        alice_first = (queue_table.c.user_id == "alice") & (done < bob_done)
        before_bob = int(conn.execute(select(func.count()).where(alice_first)).scalar_one())
    record(alice_backlog=500, alice_run_before_bob=before_bob)
    assert before_bob <= 16, f"{before_bob} of alice's conversations ran before bob's"


# -- 5. rows that cannot be decoded ------------------------------------------------------------

UNDECODABLE: dict[str, Any] = {
    "scalar": 5,
    "object": {"role": "user", "content": "hi"},
    "wrong types": [{"role": "user", "content": 7}],
    "missing keys": [{"role": "user"}],
    "not an object": ["hello"],
    "oversized": [{"role": "user", "content": "x" * 1_100_000}],
    "nested 5,000 deep": "[" * 5_000 + "]" * 5_000,
}
"""``messages`` of rows an older version or a DBA wrote; a string is stored as raw JSON text."""
BAD_THREADS = {"a NUL in the thread id": "evil\x00thread", "a 300-character thread id": "t" * 300}
"""Thread ids an older version (NUL, on SQLite) or a DBA (SQLite does not enforce lengths) wrote."""


def test_rows_that_cannot_be_decoded_go_dead_and_workers_move_on(sql_url: str, llm: OpenAIStubServer) -> None:
    configure(**settings(sql_url, llm, queue_workers=0, debounce_seconds=1))
    upgrade(sql_url)
    now = datetime.now(UTC)
    rows = [(f"bad-{index}", messages) for index, messages in enumerate(UNDECODABLE.values())]
    engine = get_engine(sql_url)
    if engine.dialect.name == "sqlite":  # PostgreSQL refuses both at the INSERT
        rows += [(thread, [{"role": "user", "content": "hi"}]) for thread in BAD_THREADS.values()]
    with engine.begin() as conn:
        for thread, messages in rows:
            values = dict(
                thread_id=thread, user_id="mallory", agent_name="", messages=[],
                correction_detected=False, reinforcement_detected=False, state="pending",
                generation=1, attempts=0, captured_at=now, pending_since=now, due_at=now,
                latest_due_at=now, enqueued_by="a DBA", created_at=now, updated_at=now,
            )  # fmt: skip
            row_id = conn.execute(
                insert(queue_table).values(**values).returning(queue_table.c.id)
            ).scalar_one()
            raw = messages if isinstance(messages, str) else json.dumps(messages)
            cast_to = "jsonb" if engine.dialect.name == "postgresql" else "text"
            conn.execute(
                sql_text(f"UPDATE memory_queue SET messages = CAST(:raw AS {cast_to}) WHERE id = :id"),
                {"raw": raw, "id": row_id},
            )
    queue = DatabaseUpdateQueue(sql_url, workers=2)
    try:
        queue.add_nowait("t", turn("alice-1"), user_id="alice")
        wait_for(lambda: facts_of(sql_url, "alice") == ["fact alice-1"], 15, "alice's turn")
        wait_for(lambda: queue_rows(sql_url)["dead"] == len(rows), 15, "the bad rows to die")
        assert all(thread.is_alive() for thread in queue._threads), "a bad row ended a worker thread"
    finally:
        queue.close()
    with get_engine(sql_url).connect() as conn:
        errors = (
            conn.execute(select(queue_table.c.last_error).where(queue_table.c.state == "dead"))
            .scalars()
            .all()
        )
    assert all(error.startswith("undecodable row: ") for error in errors), errors
    assert queue.stats.dead == len(rows)


# -- 6. the queue follows the configuration ----------------------------------------------------


def test_each_turn_lands_in_the_database_configured_when_it_was_captured(
    tmp_path: Path, llm: OpenAIStubServer
) -> None:
    urls = [f"sqlite:///{tmp_path / name}.db" for name in ("first", "second")]
    middleware = MemoryMiddleware()
    for index, url in enumerate([urls[0], urls[1], urls[0]]):
        configure(**settings(url, llm, queue_workers=0))
        middleware.after_agent(turn(f"turn{index}"), thread_id=f"t{index}", user_id="alice")
        assert get_memory_queue().pending_count == 1
        get_memory_queue().flush()
    assert facts_of(urls[0], "alice") == ["fact turn0", "fact turn2"]
    assert facts_of(urls[1], "alice") == ["fact turn1"]


# -- 7. clear() --------------------------------------------------------------------------------


def test_a_rebuilt_queue_takes_over_what_this_process_queued_on_that_database(
    tmp_path: Path, llm: OpenAIStubServer
) -> None:
    first, second = (f"sqlite:///{tmp_path / name}.db" for name in ("first", "second"))
    configure(**settings(first, llm, queue_workers=0))
    get_memory_queue().add("t1", turn("early"), user_id="alice")
    configure(**settings(second, llm, queue_workers=0))
    get_memory_queue().add("t2", turn("elsewhere"), user_id="alice")
    configure(**settings(first, llm, queue_workers=0))
    queue = get_memory_queue()
    queue.add("t3", turn("late"), user_id="alice")
    assert queue.pending_count == 2, "the turn queued before the switches is not this process's any more"
    queue.flush()
    assert facts_of(first, "alice") == ["fact early", "fact late"]


def test_the_memory_queue_says_so_when_the_storage_changes_under_queued_turns(
    tmp_path: Path, llm: OpenAIStubServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The memory queue saves with the configuration current when it runs: its turns are not
    dropped by a switch, and the switch is logged rather than silent."""
    stores = [f"sqlite:///{tmp_path / name}.db" for name in ("a", "b")]
    configure(**settings(stores[0], llm, queue_backend="memory"))
    queue = get_memory_queue()
    queue.add("t1", turn("captured-under-a"), user_id="alice")
    configure(**settings(stores[1], llm, queue_backend="memory"))
    with caplog.at_level(logging.WARNING, logger="memstore.queue"):
        assert get_memory_queue() is queue
    assert "the storage changed with 1 conversation(s) queued in memory" in caplog.text
    queue.flush()
    assert facts_of(stores[1], "alice") == ["fact captured-under-a"]


def test_clear_drops_this_process_s_unclaimed_turns_only(sql_url: str, llm: OpenAIStubServer) -> None:
    configure(**settings(sql_url, llm, queue_workers=0))
    mine, other = DatabaseUpdateQueue(sql_url, workers=0), DatabaseUpdateQueue(sql_url, workers=0)
    try:
        mine.add("t1", turn("a"), user_id="alice")
        mine.add("t2", turn("b"), user_id="bob")
        other.add("t3", turn("c"), user_id="carol")
        mine.clear()
        assert mine.pending_count == 0 and other.pending_count == 1
        other.flush()
    finally:
        mine.close()
        other.close()
    assert facts_of(sql_url, "carol") == ["fact c"]
    assert facts_of(sql_url, "alice") == []


def test_the_memory_queue_s_clear_drops_its_pending_turns(tmp_path: Path, llm: OpenAIStubServer) -> None:
    store = f"sqlite:///{tmp_path / 'store'}.db"
    configure(**settings(store, llm, queue_backend="memory"))
    queue = get_memory_queue()
    queue.add("t1", turn("dropped"), user_id="alice")
    queue.clear()
    assert queue.pending_count == 0
    queue.add("t2", turn("kept"), user_id="alice")
    queue.flush()
    assert facts_of(store, "alice") == ["fact kept"]


# -- flush binds a constant number of parameters per claim --------------------------------------


def test_flush_binds_as_many_parameters_for_its_last_claim_as_for_its_first(
    sql_url: str, llm: OpenAIStubServer
) -> None:
    configure(**settings(sql_url, llm, queue_workers=0))
    queue = get_memory_queue()
    for index in range(40):
        queue.add(f"t{index}", turn(f"x{index}"), user_id=f"user{index}")
    bound: list[int] = []

    def count(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "memory_queue_claims" in statement and "candidate" in statement:  # a claim's statement
            bound.append(len(parameters))

    engine = get_engine(sql_url)
    event.listen(engine, "before_cursor_execute", count)
    try:
        queue.flush()
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(bound) >= 40 and max(bound) == bound[len(bound) // 2], bound


# -- 2. the log of the failure paths -------------------------------------------------------------


@pytest.fixture
def hostile_reply(llm: OpenAIStubServer) -> Iterator[OpenAIStubServer]:
    llm.default_reply = lambda body: "I refuse: SECRET-CONTENT-MARKER says the user wants tea"
    yield llm


def test_failure_logs_carry_no_user_id_and_no_words(
    sql_url: str, hostile_reply: OpenAIStubServer, caplog: pytest.LogCaptureFixture
) -> None:
    configure(**settings(sql_url, hostile_reply, queue_workers=0, update_max_attempts=1))
    queue = get_memory_queue()
    user = "marker-user-4711"
    with caplog.at_level(logging.DEBUG, logger="memstore"):
        MemoryMiddleware().after_agent(
            turn("x", " SECRET-CONTENT-MARKER"), thread_id="secret-thread-marker", user_id=user
        )
        queue.flush()  # the reply does not parse: the row fails and is dead
        assert queue_rows(sql_url)["dead"] == 1
        MemoryMiddleware().after_agent(turn("y"), thread_id="t", user_id="not valid!")  # a caller's error
        MemoryMiddleware().after_agent(turn("z"), thread_id="t", user_id=f"bad id {user}")
        hostile_reply.script(ScriptedError(400, "bad request; received: User: SECRET-CONTENT-MARKER"))
        queue.add_nowait("t-400", turn("w", " SECRET-CONTENT-MARKER"), user_id=user)
        queue.flush()  # the endpoint refuses with a 400 quoting the prompt: dead again
        assert queue_rows(sql_url)["dead"] == 2
        queue.shutdown(1.0)
        queue.add("secret-thread-marker", turn("late"), user_id=user)  # after shutdown: dropped
    logged = caplog.text + "".join(record.getMessage() for record in caplog.records)
    assert "is dead" in logged and "MemoryUpdateParseError" in logged
    assert "LLMError (BadRequestError 400)" in logged and "shut down; dropped a conversation" in logged
    for secret in ("SECRET-CONTENT-MARKER", user, "secret-thread-marker", "tea"):
        assert secret not in logged, secret


def test_an_outage_logs_the_database_not_the_turn(
    tmp_path: Path, llm: OpenAIStubServer, caplog: pytest.LogCaptureFixture
) -> None:
    dead = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"
    configure(**settings(dead, llm, queue_workers=0, queue_enqueue_timeout_seconds=1.0))
    queue = DatabaseUpdateQueue(dead, workers=0)
    with caplog.at_level(logging.DEBUG, logger="memstore"):
        queue.add("t", turn("x", " SECRET-CONTENT-MARKER"), user_id="marker-user-4711")
        assert len(queue._buffer) == 1, "the turn was not buffered through the outage"
        queue.close()
    assert "buffering in this process" in caplog.text
    assert "SECRET-CONTENT-MARKER" not in caplog.text and "marker-user-4711" not in caplog.text


# -- what an operator sees: queue status and metrics ---------------------------------------------


def test_queue_status_and_metrics_show_the_bounds_and_refusals(
    sql_url: str, llm: OpenAIStubServer, tmp_path: Path
) -> None:
    configure(**settings(sql_url, llm, queue_workers=0, max_queue_depth=20))
    queue = get_memory_queue()
    before = REGISTRY.get_sample_value("memstore_queue_rejected_total", {"reason": "user_share"}) or 0.0
    for index in range(5):  # a user's share of 20 is 2 conversations
        queue.add(f"t{index}", turn(f"m{index}"), user_id="mallory")
    queue.add("t", turn("ok"), user_id="alice")
    assert queue.stats.rejected_user_share == 3
    after = REGISTRY.get_sample_value("memstore_queue_rejected_total", {"reason": "user_share"})
    assert after == before + 3
    now = datetime.now(UTC)
    with get_engine(sql_url).begin() as conn:  # 44 conversations finished in the last 30 s
        for index in range(44):
            conn.execute(
                insert(queue_table).values(
                    thread_id=f"done-{index}", user_id="carol", agent_name="", messages=[],
                    correction_detected=False, reinforcement_detected=False, state="done",
                    generation=1, attempts=1, captured_at=now, pending_since=now, due_at=now,
                    latest_due_at=now, enqueued_by="x", created_at=now, updated_at=now,
                    completed_at=now - timedelta(seconds=30 - index * 0.5),
                )
            )  # fmt: skip
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")},
        "MEMSTORE_DATABASE_URL": sql_url,
        "MEMSTORE_MAX_QUEUE_DEPTH": "20",
        "MEMSTORE_DATA_DIR": str(tmp_path),
    }
    memstore = str(Path(sys.executable).with_name("memstore"))
    text = subprocess.run(
        [memstore, "queue", "status"], env=env, capture_output=True, text=True, check=True
    ).stdout
    figures = json.loads(
        subprocess.run(
            [memstore, "queue", "status", "--json"], env=env, capture_output=True, text=True, check=True
        ).stdout
    )
    assert "bounds: 3 of 20 conversations" in text and "users at their share (0.1): 1" in text
    assert figures["users_at_share"] == 1 and figures["held_chars"] > 0
    # 44 in the last 30 s is 44 a minute (the window is at least a minute), not 44 over 15 minutes.
    assert figures["throughput_window_seconds"] == 60.0
    assert figures["throughput_per_minute"] == pytest.approx(44.0)
    assert "44.0/min (last 60 s)" in text


# -- revision 0007 measures the rows already queued --------------------------------------------


def test_revision_0007_measures_queued_rows_as_the_code_does(sql_url: str) -> None:
    upgrade(sql_url, "0006")
    downgrade(sql_url, "0006")  # a PostgreSQL test database starts at head
    now = datetime.now(UTC)
    messages = [{"role": "user", "content": "\x01" * 1_002}, {"role": "assistant", "content": "ok"}]
    with get_engine(sql_url).begin() as conn:
        for state in ("pending", "dead", "done"):
            conn.execute(
                insert(queue_table).values(  # no message_chars: the column does not exist yet
                    thread_id=state, user_id="u", agent_name="", messages=[] if state == "done" else messages,
                    correction_detected=False, reinforcement_detected=False, state=state,
                    generation=1, attempts=0, captured_at=now, pending_since=now, due_at=now,
                    latest_due_at=now, enqueued_by="x", created_at=now, updated_at=now,
                )
            )  # fmt: skip
    upgrade(sql_url)
    with get_engine(sql_url).connect() as conn:
        measured = dict(conn.execute(select(queue_table.c.state, queue_table.c.message_chars)).all())
    expected = stored_message_chars(messages)
    assert measured == {"pending": expected, "dead": expected, "done": 0}
