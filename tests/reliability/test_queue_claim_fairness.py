"""Claims: a scope another transaction holds stops nobody, no backlog starves, no row poisons.

Run on SQLite and PostgreSQL where each applies, at the level of ``queue_claims.claim`` with a
clock of the test's own (every time a claim or settle sees is the test's), but for the last,
which runs the real workers:

1. PostgreSQL: while a transaction holds a scope's queue rows (an erase deleting a user's rows)
   or its claim row (a heartbeat, a settle), a claim passes that scope over for the next one in
   fairness order, and waits for neither.
2. A user with a backlog is served in turn while new users keep arriving, and so is a tenant with
   a backlog while another tenant's new users keep arriving: a conversation that fell due after
   the backlog was last served waits behind it.
3. A row whose text is not UTF-8, or whose time is not one, goes to ``dead`` with an error naming
   the column (never its content), and every other row, of its scope and of others, is run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, delete, select, update
from sqlalchemy import text as sql_text

from memstore.queue import DatabaseUpdateQueue
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.queue import claims as queue_claims
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.claim_sql import CLAIM_BATCH
from memstore.storage.sql.queue.table import QueuedConversation, ScopeClaim
from memstore.storage.sql.schema.models import claims_table
from memstore.storage.sql.schema.models import queue_table as queue_rows_table
from tests.reliability.conftest import configure
from tests.reliability.queue_support import llm_config, queue_rows, stored_facts
from tests.reliability.queue_support import token_reply as remember
from tests.support.openai_server import OpenAIStubServer

T0 = datetime(2031, 3, 1, 12, 0, tzinfo=UTC)
"""The tests' clock starts here: claims, settles and due times all read it, never the wall's."""
LEASE = 3600.0
"""Long enough that no claim held by a test expires while the clock runs."""


def _turn(text: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"Please remember {text} for later."},
        {"role": "assistant", "content": "ok"},
    ]


def _enqueue(engine: Engine, tenant: str, thread: str, user: str, due: datetime) -> None:
    item = QueuedConversation(thread, user, None, _turn(thread), False, False, due, tenant)
    with engine.begin() as conn:
        queue_table.enqueue(conn, item, owner="o", now=due, due_at=due, latest_due_at=due)


@contextmanager
def _claimer(engine: Engine) -> Iterator[Connection]:
    """A connection as the workers claim on: autocommit on PostgreSQL, a write transaction on SQLite."""
    if engine.dialect.name == "postgresql":
        with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
            yield conn
        return
    with engine.connect() as conn:
        conn.execution_options(**queue_table.write_options(5000))
        with conn.begin():
            yield conn


def _claim(engine: Engine, now: datetime, owner: str = "w") -> ScopeClaim | None:
    with _claimer(engine) as conn:
        return queue_claims.claim(conn, owner=owner, now=now, lease_seconds=LEASE)


def _settle(engine: Engine, claim: ScopeClaim, now: datetime) -> None:
    """What the runner does when every save succeeds: the last row's settle gives the claim back."""
    assert not claim.undecodable
    for index, leased in enumerate(claim.conversations):
        leased.lease.releases_claim = index == len(claim.conversations) - 1
        with engine.connect() as conn:
            conn.execution_options(**queue_table.write_options(5000))
            with conn.begin():
                assert queue_table.complete(conn, leased.lease, now=now), "a settle was lost"


# -- 1. a scope another transaction holds ------------------------------------------------------


@pytest.fixture
def no_waits(postgres_url: str) -> Iterator[Engine]:
    """The database's engine, whose every lock wait fails at once instead of hanging the test: a
    claim that waited for the held scope raises ``LockNotAvailable``."""
    engine = create_engine(postgres_url, connect_args={"options": "-c lock_timeout=2000"})
    yield engine
    engine.dispose()


@contextmanager
def _held(engine: Engine, statement: Any) -> Iterator[None]:
    """``statement`` run in a transaction left open, on a thread of its own, until the block ends."""
    holding, done = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def hold() -> None:
        try:
            with engine.begin() as conn:
                conn.execute(statement)
                holding.set()
                done.wait(60)
        except BaseException as exc:  # reported below, not lost on the thread
            failure.append(exc)
            holding.set()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    holding.wait(60)
    try:
        assert not failure, failure
        yield
    finally:
        done.set()
        thread.join(60)


def _first_and_second(engine: Engine) -> None:
    """acme's user U first in fairness order, globex's user V due after it."""
    for index in range(3):
        _enqueue(engine, "acme", f"u{index}", "U", T0 + timedelta(seconds=index))
    _enqueue(engine, "globex", "v0", "V", T0 + timedelta(minutes=1))


def _of_user(table: Any, user: str) -> Any:
    return (table.c.tenant_id == "acme") & (table.c.user_id == user)


@pytest.mark.postgres
def test_a_claim_passes_over_a_scope_whose_rows_an_erase_holds(no_waits: Engine) -> None:
    _first_and_second(no_waits)
    now = T0 + timedelta(minutes=5)
    # As an erase does in its long transaction: U's queue rows deleted, not yet committed.
    with _held(no_waits, delete(queue_rows_table).where(_of_user(queue_rows_table, "U"))):
        first = _claim(no_waits, now, owner="w1")
        second = _claim(no_waits, now, owner="w2")
    assert first is not None and (first.tenant_id, first.user_id) == ("globex", "V")
    assert [leased.conversation.thread_id for leased in first.conversations] == ["v0"]
    assert second is None, "U's rows are held and V is claimed: nothing is free"
    with no_waits.connect() as conn:  # the attempts on U left no claim of theirs behind
        assert conn.execute(select(claims_table.c.user_id)).scalars().all() == ["V"]


@pytest.mark.postgres
def test_a_claim_passes_over_a_scope_whose_claim_row_another_transaction_holds(no_waits: Engine) -> None:
    _first_and_second(no_waits)
    _enqueue(no_waits, "globex", "v1", "V", T0 + timedelta(minutes=1))
    # U, then V, served once and given back with rows left: U is first in any order that
    # counts service, which is what the claim rows now record.
    for user, when in (("U", T0 + timedelta(minutes=2)), ("V", T0 + timedelta(minutes=3))):
        served = _claim(no_waits, when)
        assert served is not None and served.user_id == user
        with no_waits.begin() as conn:
            queue_table.release(conn, served.token, now=when)
    now = T0 + timedelta(minutes=5)
    # A heartbeat or a settle of U's claim row, in progress: U is still first in order.
    held = update(claims_table).where(_of_user(claims_table, "U")).values(lease_owner="someone")
    with _held(no_waits, held):
        claim = _claim(no_waits, now)
    assert claim is not None and (claim.tenant_id, claim.user_id) == ("globex", "V")
    again = _claim(no_waits, now, owner="w2")
    assert again is not None and again.user_id == "U", "once the transaction ends, U is claimable again"


# -- 2. no backlog starves -----------------------------------------------------------------------


def test_a_user_s_backlog_is_served_while_new_users_keep_arriving(sql_url: str) -> None:
    """Four workers, one tenant: ``heavy`` has a backlog, and a new user arrives, due at once,
    each time a claim is settled, faster than the workers keep up with. Before, never-served
    scopes went first and ``heavy`` waited behind every newcomer: one claim of 120. Now nobody
    that fell due after ``heavy`` was last served is claimed before ``heavy`` is again."""
    engine = get_engine(sql_url)
    for index in range(400):
        _enqueue(engine, "acme", f"h{index}", "heavy", T0 - timedelta(hours=1) + timedelta(seconds=index))
    clock = T0
    due: dict[str, datetime] = {}

    def arrive() -> None:
        user = f"light{len(due)}"
        _enqueue(engine, "acme", user, user, clock)
        due[user] = clock

    for _ in range(8):
        arrive()
    outstanding: list[ScopeClaim] = []
    served: list[str] = []
    heavy_served: datetime | None = None
    heavy_waiting = False  # settled, with rows left: claimable
    for _ in range(120):
        clock += timedelta(seconds=1)
        claim = _claim(engine, clock)
        assert claim is not None, "work is due and a worker is free"
        served.append(claim.user_id)
        if claim.user_id == "heavy":
            heavy_served, heavy_waiting = clock, False
        elif heavy_waiting:
            assert heavy_served is not None and due[claim.user_id] <= heavy_served, (
                f"{claim.user_id}, due after heavy was last served, went first: {served}"
            )
        outstanding.append(claim)
        if len(outstanding) == 4:
            settled = outstanding.pop(0)
            _settle(engine, settled, clock)
            heavy_waiting = heavy_waiting or settled.user_id == "heavy"
            arrive()
    heavy = served.count("heavy")
    assert heavy >= 8, f"heavy got {heavy} of {len(served)} claims: {served}"


def test_a_tenant_s_backlog_is_served_while_another_tenant_s_users_keep_arriving(sql_url: str) -> None:
    """One worker: globex has one user with a backlog; acme a new user, due at once, for every
    claim. Before, acme (no claim row left between its one-conversation scopes, so never served)
    always went first, and globex waited as long as acme had anyone queued: one claim of 40. Now
    no acme user that fell due after globex was last served is claimed before globex is again."""
    engine = get_engine(sql_url)
    for index in range(100):
        _enqueue(engine, "globex", f"g{index}", "gu", T0 - timedelta(hours=1) + timedelta(seconds=index))
    due: dict[str, datetime] = {}
    for index in range(3):
        _enqueue(engine, "acme", f"a{index}", f"u{index}", T0 - timedelta(minutes=30))
        due[f"u{index}"] = T0 - timedelta(minutes=30)
    clock = T0
    served: list[str] = []
    globex_served: datetime | None = None
    for step in range(40):
        clock += timedelta(seconds=1)
        claim = _claim(engine, clock)
        assert claim is not None
        served.append(claim.tenant_id)
        if claim.tenant_id == "globex":
            assert len(claim.conversations) == CLAIM_BATCH, "a backlog is served a batch at a time"
            globex_served = clock
        elif globex_served is not None:
            assert due[claim.user_id] <= globex_served, f"{claim.user_id} went before globex: {served}"
        _settle(engine, claim, clock)
        user = f"u{step + 3}"
        _enqueue(engine, "acme", user, user, clock)
        due[user] = clock
    globex = served.count("globex")
    assert globex >= 5, f"globex got {globex} of {len(served)} claims: {served}"


def test_a_newcomer_due_after_a_backlog_was_served_waits_behind_it(sql_url: str) -> None:
    """The order itself: the tenant, then the scope, that has waited longest, a wait counted
    from the later of the last service and the oldest due row. ``early`` fell due before heavy
    was last served, ``late`` after it; ``other``'s tenant has not been served at all, and its
    row fell due before acme's last service (heavy's second claim)."""
    engine = get_engine(sql_url)
    for index in range(20):
        _enqueue(engine, "acme", f"h{index}", "heavy", T0 + timedelta(seconds=index))
    first = _claim(engine, T0 + timedelta(minutes=1))
    assert first is not None and first.user_id == "heavy"
    _settle(engine, first, T0 + timedelta(minutes=1))  # heavy served at T0 + 1 min, rows left
    _enqueue(engine, "acme", "early", "early", T0 + timedelta(seconds=30))  # due before that
    _enqueue(engine, "acme", "late", "late", T0 + timedelta(minutes=2))  # due after it
    _enqueue(engine, "globex", "other", "other", T0 + timedelta(minutes=3))
    order = []
    for step in range(4):
        claim = _claim(engine, T0 + timedelta(minutes=10, seconds=step))
        assert claim is not None
        order.append(claim.user_id)
        _settle(engine, claim, T0 + timedelta(minutes=10, seconds=step))
    assert order == ["early", "heavy", "other", "late"]


# -- 3. rows no driver can read ----------------------------------------------------------------

SECRET = "SECRETWORD"
"""In every malformed row: no error, log line or metric may repeat it."""


def _malformed(dialect: str) -> dict[str, str]:
    """Per column, SQL that stores what an older version or a DBA might have: bytes that are not
    UTF-8 (SQLite stores what it is given), a time that is not one, an infinite time (PostgreSQL)."""
    if dialect == "postgresql":
        return {"captured_at": "'infinity'", "due_at": "'-infinity'"}
    secret = SECRET.encode().hex()
    message = f'[{{"role":"user","content":"{SECRET}'.encode().hex() + "80ff" + b'"}]'.hex()
    return {
        "messages": f"CAST(X'{message}' AS TEXT)",
        "thread_id": f"CAST(X'{secret}80ff' AS TEXT)",
        "captured_at": f"'{SECRET}'",
        # Before any time as text (so due), and not one.
        "due_at": f"CAST(X'30{secret}80ff' AS TEXT)",
    }


def test_a_row_the_driver_cannot_decode_goes_dead_and_the_queue_moves_on(
    sql_url: str, openai_server: OpenAIStubServer, caplog: pytest.LogCaptureFixture
) -> None:
    openai_server.default_reply = remember
    configure(database_url=sql_url, debounce_seconds=1, queue_workers=0, **llm_config(openai_server))
    engine = get_engine(sql_url)
    past = datetime.now(UTC) - timedelta(minutes=5)
    malformed = _malformed(engine.dialect.name)
    # mallory's malformed rows first in line, a good one of hers after them, then alice's.
    for index, column in enumerate(malformed):
        _enqueue(engine, "default", f"bad-{column}", "mallory", past + timedelta(seconds=index))
    _enqueue(engine, "default", "mallory-ok", "mallory", past + timedelta(seconds=30))
    _enqueue(engine, "default", "alice-ok", "alice", past + timedelta(seconds=40))
    with engine.begin() as conn:
        for column, raw in malformed.items():
            conn.execute(
                sql_text(f"UPDATE memory_queue SET {column} = {raw} WHERE thread_id = 'bad-{column}'")
            )

    queue = DatabaseUpdateQueue(sql_url, workers=1)
    try:
        _wait(lambda: _facts(sql_url, "alice") == ["fact alice-ok"], "alice's conversation")
        _wait(lambda: _facts(sql_url, "mallory") == ["fact mallory-ok"], "mallory's good conversation")
        _wait(lambda: queue_rows(sql_url)["dead"] == len(malformed), "the malformed rows to die")
    finally:
        queue.close()
    with engine.connect() as conn:
        errors = (
            conn.execute(select(queue_rows_table.c.last_error).where(queue_rows_table.c.state == "dead"))
            .scalars()
            .all()
        )
    named = {column: [error for error in errors if f": {column} is " in error] for column in malformed}
    assert all(len(found) == 1 for found in named.values()), errors
    assert all(error.startswith("undecodable row: ") for error in errors), errors
    assert not any(SECRET in error for error in errors), errors
    assert SECRET not in caplog.text


def _facts(url: str, user: str) -> list[str]:
    return stored_facts(url, [(user, None)])[(user, None)]


def _wait(condition: Callable[[], bool], what: str) -> None:
    """A liveness guard, not a timing assertion: the workers poll, so a result takes a while."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
