"""What the durable queue costs per conversation, counted on the engine (SQLite and PostgreSQL).

Issue 37: besides the save (which completes the row and, for a claim's last row, gives the claim
back), a conversation costs at most one write transaction: its claim. Measured on the running
worker, through the public queue: each window runs from the end of one conversation's
``process`` to the end of the next, so it holds that conversation's claim (if it started one),
its load and its save, and what the worker did in between (before issue 37: the previous
claim's release, and a read before the claim). The figures are ``count_sql``'s, the same ones
``scripts/bench_lean.py`` reports.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig, set_memory_config
from memstore.queue import DatabaseUpdateQueue, reset_memory_queue
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.queue.round_trips import SqlCount, Transaction, count_sql
from memstore.storage.sql.schema.models import claims_table, queue_table
from memstore.update.updater import MemoryUpdater

SINGLE_USERS = ["ann", "ben", "cat", "dan"]
"""One conversation each: every conversation is a claim of its own."""
BATCH_THREADS = ["t1", "t2", "t3"]
"""Three conversations of one user: one claim leases them all."""
MAX_QUEUE_STATEMENTS = 4
"""Per conversation, the statements that touch the queue's tables: the claim (PostgreSQL one,
SQLite two), the completion in the save, and the release folded into it (SQLite two at most)."""


@pytest.fixture
def configured(sql_url: str, tmp_path: Path) -> Iterator[MemoryConfig]:
    # A long lease: no heartbeat lands inside the counted windows.
    config = MemoryConfig(
        data_dir=str(tmp_path / "data"),
        database_url=sql_url,
        extractor="rules",
        queue_workers=0,
        queue_lease_seconds=600,
    )
    set_memory_config(config)
    reset_memory_storage()
    reset_memory_queue()
    get_memory_storage()  # the embedded SQLite file gets its schema from the first store built on it
    yield config
    reset_memory_queue()


class _Windowed:
    """The real updater, marking where each conversation's ``process`` ended in the count."""

    def __init__(self, count: SqlCount) -> None:
        self._inner = MemoryUpdater()
        self._count = count
        self.marks: list[int] = []
        self.done = threading.Event()

    def process(self, context: ConversationContext, lease: Any = None) -> bool:
        try:
            return self._inner.process(context, lease)
        finally:
            self.marks.append(len(self._count.transactions))
            if len(self.marks) == len(SINGLE_USERS) + len(BATCH_THREADS):
                self.done.set()


def _turn(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]


def _windows(count: SqlCount, marks: list[int]) -> list[list[Transaction]]:
    """The transactions of each conversation after the first (whose window opens with the worker)."""
    ended = list(count.transactions)
    return [ended[start:end] for start, end in itertools.pairwise(marks)]


def test_a_conversation_costs_one_write_transaction_besides_its_save(
    configured: MemoryConfig, sql_url: str
) -> None:
    enqueuer = DatabaseUpdateQueue(sql_url, workers=0)
    for user in SINGLE_USERS:
        enqueuer.add_nowait("thread", _turn(f"I prefer {user} tea."), user_id=user)
    for thread in BATCH_THREADS:
        enqueuer.add_nowait(thread, _turn(f"I prefer {thread} jazz."), user_id="eve")
    engine = get_engine(sql_url)

    with count_sql(engine) as count:
        updater = _Windowed(count)
        worker = DatabaseUpdateQueue(sql_url, lambda: updater, workers=1)
        try:
            assert updater.done.wait(60), "the worker did not run every conversation"
        finally:
            worker.shutdown(timeout=10)  # its thread ends before the listeners go
            enqueuer.close()

    windows = _windows(count, updater.marks)
    assert len(windows) == len(SINGLE_USERS) + len(BATCH_THREADS) - 1
    for index, window in enumerate(windows, start=2):
        queue_writes = [transaction for transaction in window if transaction.queue_only]
        saves = [transaction for transaction in window if transaction.writes and not transaction.queue_only]
        assert len(queue_writes) <= 1, (
            f"conversation {index}: {len(queue_writes)} write transactions besides its save "
            f"(tables {[sorted(t.written) for t in queue_writes]})"
        )
        assert len(saves) == 1 and "memory_queue" in saves[0].written, "the save completes the row"
        queue_statements = sum(transaction.queue_statements for transaction in window)
        assert queue_statements <= MAX_QUEUE_STATEMENTS, f"conversation {index}: {queue_statements}"

    with engine.connect() as conn:
        states = conn.execute(select(queue_table.c.state, func.count()).group_by(queue_table.c.state)).all()
        live = claims_table.c.lease_expires_at >= datetime.now(UTC)
        held = conn.execute(select(func.count()).select_from(claims_table).where(live)).scalar_one()
    assert dict(states) == {"done": len(SINGLE_USERS) + len(BATCH_THREADS)}
    assert held == 0, "every claim was given back by its last save"
    assert sorted(f["content"] for f in get_memory_storage().load(user_id="eve")["facts"]) == [
        f"User prefers {thread} jazz" for thread in BATCH_THREADS
    ]
