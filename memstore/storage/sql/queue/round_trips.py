"""What a piece of work costs the database: its statements and transactions, as an engine sees them.

The durable queue promises one write transaction per conversation besides the save, which
completes the row and gives the claim back. ``count_sql`` is how that is checked: the queue's
round-trip test asserts it on both dialects, and ``scripts/bench_lean.py`` reports it. It listens
to the engine's ``begin``, ``before_cursor_execute``, ``commit`` and ``rollback`` events (an
option engine of it, such as the claimer's autocommit one, reports through the same listeners).

A transaction is one ``begin`` to its ``commit`` or ``rollback``; on an autocommit connection each
statement is a transaction of its own. It is a write transaction when one of its statements
inserts, updates or deletes, or when it began as a SQLite write (``BEGIN IMMEDIATE``, which
takes the write lock). ``BEGIN``, ``COMMIT`` and ``ROLLBACK`` themselves are not counted as
statements: SQLite's go through the driver as text, psycopg's do not, so counting them would
make the dialects' figures incomparable.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, event

from memstore.storage.sql.engine import SQLITE_WRITE_OPTION

QUEUE_TABLES = frozenset({"memory_queue", "memory_queue_claims"})
_CONTROL = re.compile(r"\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b", re.IGNORECASE)
_WRITTEN = re.compile(r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)", re.IGNORECASE)
_NOT_TABLES = frozenset({"set", "of", "skip", "nowait"})
"""What follows UPDATE in ``DO UPDATE SET`` and ``FOR UPDATE [OF | SKIP LOCKED | NOWAIT]``."""
_QUEUE_TABLE = re.compile(r"\bmemory_queue(?:_claims)?\b", re.IGNORECASE)
_OPEN = "memstore_sql_count_open"


@dataclass
class Transaction:
    statements: int = 0
    queue_statements: int = 0
    """Its statements that read or write the queue's tables (a save's completion included)."""
    written: set[str] = field(default_factory=set)
    """The tables its statements insert into, update or delete from."""
    write_intent: bool = False
    """Begun as a SQLite write (``BEGIN IMMEDIATE``)."""

    @property
    def writes(self) -> bool:
        return bool(self.written) or self.write_intent

    @property
    def queue_only(self) -> bool:
        """A write transaction of the queue's own (a claim, a release, a settle), not a save."""
        return self.writes and self.written <= QUEUE_TABLES


@dataclass
class SqlCount:
    """Every transaction seen so far, in the order they ended."""

    transactions: list[Transaction] = field(default_factory=list)

    @property
    def statements(self) -> int:
        return sum(transaction.statements for transaction in self.transactions)

    @property
    def write_transactions(self) -> list[Transaction]:
        return [transaction for transaction in self.transactions if transaction.writes]

    @property
    def queue_transactions(self) -> list[Transaction]:
        """Write transactions that wrote the queue's tables only: what the queue adds to a save."""
        return [transaction for transaction in self.transactions if transaction.queue_only]

    def per(self, conversations: int) -> dict[str, float]:
        """The figures divided by ``conversations``, as the benchmark reports them."""
        count = max(conversations, 1)
        reads = [transaction for transaction in self.transactions if not transaction.writes]
        return {
            "statements": self.statements / count,
            "transactions": len(self.transactions) / count,
            "write_transactions": len(self.write_transactions) / count,
            "queue_write_transactions": len(self.queue_transactions) / count,
            "queue_statements": sum(t.queue_statements for t in self.transactions) / count,
            "read_transactions": len(reads) / count,
        }


@contextmanager
def count_sql(engine: Engine) -> Iterator[SqlCount]:
    """Count the statements and transactions ``engine`` (and its option engines) runs meanwhile."""
    count = SqlCount()

    def begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        conn.info[_OPEN] = Transaction(write_intent=bool(options.get(SQLITE_WRITE_OPTION)))

    def statement(conn: Connection, _cursor: Any, text: str, *_args: Any) -> None:
        if _CONTROL.match(text):
            return
        written = {table.lower() for table in _WRITTEN.findall(text)} - _NOT_TABLES
        queue = int(bool(_QUEUE_TABLE.search(text)))
        open_ = conn.info.get(_OPEN)
        if open_ is None or conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            count.transactions.append(Transaction(1, queue, written))
            return
        open_.statements += 1
        open_.queue_statements += queue
        open_.written |= written

    def end(conn: Connection) -> None:
        open_ = conn.info.pop(_OPEN, None)
        autocommit = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
        if open_ is not None and not autocommit and (open_.statements or open_.write_intent):
            count.transactions.append(open_)

    listeners = (("begin", begin), ("before_cursor_execute", statement), ("commit", end), ("rollback", end))
    for name, listener in listeners:
        event.listen(engine, name, listener)
    try:
        yield count
    finally:
        for name, listener in listeners:
            event.remove(engine, name, listener)
