"""``memory_history``'s month partitions on the partitioned layout (``partition.py``).

History is range-partitioned on ``changed_at`` by calendar month (UTC): one partition per month,
named ``memory_history_yYYYYmMM``, plus ``memory_history_default`` for any row outside them, so an
insert never fails. ``vacuum`` keeps the months ahead created (``ensure_months``) and drops every
month that ends at or before its cut-off (``drop_months_before``) instead of deleting its rows one
by one; the rows of the month the cut-off falls in, and of the default partition, are deleted as on
the plain layout.

A month created while the default partition holds rows of it takes them over: they are moved into
the new table before it is attached (attaching would otherwise fail on the default's rows), with
the default partition locked against inserts meanwhile.

Dropping or attaching a month locks ``memory_history`` exclusively, which stops every save: vacuum
does both after its purge has committed, each in its own short transaction (``month_transaction``:
a ``lock_timeout``, and an advisory lock so two vacuums never collide). What fails to get its lock
in time is left for the next vacuum.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, text
from sqlalchemy.dialects import postgresql

from memstore.storage.sql.schema.partition_layout import is_partitioned

HISTORY = "memory_history"
HISTORY_KEY = "changed_at"
DEFAULT_PARTITION = f"{HISTORY}_default"
MONTHS_AHEAD = 3
"""Months after the current one that ``vacuum`` keeps created."""
MAX_MONTHS_AHEAD = 24
LOCK_TIMEOUT = "5s"
"""How long a month's drop or creation waits for ``memory_history`` before it is left for later."""
MONTHS_LOCK_KEY = 0x6D656D6D6F6E7468
"""The transaction advisory lock that serialises vacuums' month drops and creations."""
_DIALECT = postgresql.dialect()  # type: ignore[no-untyped-call]


def quote(name: str) -> str:
    """``name`` as a PostgreSQL identifier, quoted where it needs to be (a name read from the catalog)."""
    return str(_DIALECT.identifier_preparer.quote(name))


_quote = quote
_MONTH_NAME = re.compile(rf"{HISTORY}_y(\d{{4}})m(\d{{2}})")
_CHILDREN = text(
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
    "JOIN pg_class p ON p.oid = i.inhparent "
    "WHERE p.relname = :table AND p.relnamespace = current_schema()::regnamespace"
)


@dataclass(frozen=True, order=True)
class Month:
    year: int
    month: int

    @classmethod
    def of(cls, moment: datetime) -> Month:
        moment = utc(moment)
        return cls(moment.year, moment.month)

    def plus(self, months: int) -> Month:
        index = self.year * 12 + self.month - 1 + months
        return Month(index // 12, index % 12 + 1)

    @property
    def name(self) -> str:
        return f"{HISTORY}_y{self.year:04d}m{self.month:02d}"

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=UTC)

    def bounds(self) -> str:
        """The partition bound clause, in UTC."""
        return f"FROM ('{_literal(self.start)}') TO ('{_literal(self.plus(1).start)}')"


def utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive one is taken as UTC already (as the plain layout compares it)."""
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


def _literal(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S+00")


def existing_months(conn: Connection) -> list[Month]:
    """The month partitions of ``memory_history``, oldest first (the default is not one)."""
    names = conn.execute(_CHILDREN, {"table": HISTORY}).scalars()
    found = (_MONTH_NAME.fullmatch(str(name)) for name in names)
    return sorted(Month(int(m.group(1)), int(m.group(2))) for m in found if m is not None)


def secure_statements(table: str, owner: str | None) -> list[str]:
    """A partition's own guards: row-level security forced with no policy (nobody but a superuser or
    ``BYPASSRLS`` role reads it directly; through the parent, the parent's policies apply) and the
    parent's owner."""
    statements = [f"ALTER TABLE {table} {how} ROW LEVEL SECURITY" for how in ("ENABLE", "FORCE")]
    if owner is not None:
        statements.append(f"ALTER TABLE {table} OWNER TO {_quote(owner)}")
    return statements


def create_month_statements(month: Month, owner: str | None) -> list[str]:
    """A new month, attached to the parent, taking over the default partition's rows of it."""
    return [
        # No insert lands in the default partition between the move and the attach (it would fail).
        f"LOCK TABLE {DEFAULT_PARTITION} IN SHARE ROW EXCLUSIVE MODE",
        f"CREATE TABLE {month.name} (LIKE {HISTORY} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
        f"WITH moved AS (DELETE FROM {DEFAULT_PARTITION} WHERE {HISTORY_KEY} >= '{_literal(month.start)}' "
        f"AND {HISTORY_KEY} < '{_literal(month.plus(1).start)}' RETURNING *) "
        f"INSERT INTO {month.name} SELECT * FROM moved",
        f"ALTER TABLE {HISTORY} ATTACH PARTITION {month.name} FOR VALUES {month.bounds()}",
        *secure_statements(month.name, owner),
    ]


@contextmanager
def month_transaction(conn: Connection) -> Iterator[None]:
    """One short transaction for month drops or creations: a lock timeout, under the months' lock."""
    with conn.begin():
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MONTHS_LOCK_KEY})
        yield


def droppable_months(conn: Connection, cutoff: datetime) -> list[Month]:
    """The month partitions that end at or before ``cutoff``: every row in them is older."""
    if not is_partitioned(conn, HISTORY):
        return []
    cutoff = utc(cutoff)
    return [month for month in existing_months(conn) if month.plus(1).start <= cutoff]


def ensure_months(conn: Connection, now: datetime, ahead: int = MONTHS_AHEAD) -> list[str]:
    """Create the current month and ``ahead`` more where missing; returns the partitions created."""
    if not is_partitioned(conn, HISTORY):
        return []
    have = set(existing_months(conn))
    owner = _owner(conn)
    created: list[str] = []
    current = Month.of(now)
    for offset in range(min(max(ahead, 0), MAX_MONTHS_AHEAD) + 1):
        month = current.plus(offset)
        if month in have:
            continue
        for statement in create_month_statements(month, owner):
            conn.exec_driver_sql(statement)
        created.append(month.name)
    return created


def drop_months_before(conn: Connection, cutoff: datetime) -> int:
    """Drop every month partition that ends at or before ``cutoff``; returns the rows they held."""
    if not is_partitioned(conn, HISTORY):
        return 0
    dropped = 0
    for month in droppable_months(conn, cutoff):
        dropped += int(conn.exec_driver_sql(f"SELECT count(*) FROM {month.name}").scalar_one())
        conn.exec_driver_sql(f"DROP TABLE {month.name}")
    return dropped


def _owner(conn: Connection) -> str | None:
    return conn.execute(
        text("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass(:table)"),
        {"table": HISTORY},
    ).scalar_one_or_none()
