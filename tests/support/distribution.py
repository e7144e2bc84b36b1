"""Does each statement reach one shard? The distribution layout of docs/scale.md, checked on plans.

Every statement a path sends is recorded with its parameters, then planned again with
``EXPLAIN (FORMAT JSON)`` on PostgreSQL. A scan (or an insert) of a distributed table must be
pinned to one value of that table's distribution column, the way Citus prunes shards: by a
constant or bound parameter (``scope_id = 42``, ``user_id = ANY(...)``), by a subquery's value
(``scope_id = $0``, where the subquery reads the routing table), or by a join on the
distribution column to a co-located table that is itself pinned. PostgreSQL's planner already
propagates ``a.scope_id = b.id AND b.id = 42`` to both sides, so the plan shows what Citus sees.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url

SCOPE_GROUP = "scope"
USER_GROUP = "user"
REFERENCE = "reference"
COORDINATOR = "coordinator"


@dataclass(frozen=True)
class Placement:
    """How one table is laid out on Citus: its co-location group and distribution column."""

    group: str
    column: str | None

    @property
    def distributed(self) -> bool:
        return self.group in (SCOPE_GROUP, USER_GROUP)


LAYOUT: dict[str, Placement] = {
    # The scope group: one shard holds a scope's row and everything hanging off it.
    "memory_scopes": Placement(SCOPE_GROUP, "id"),
    "memory_sections": Placement(SCOPE_GROUP, "scope_id"),
    "memory_scope_snapshots": Placement(SCOPE_GROUP, "scope_id"),
    "memory_facts": Placement(SCOPE_GROUP, "scope_id"),
    "memory_history": Placement(SCOPE_GROUP, "scope_id"),
    "memory_fact_embeddings": Placement(SCOPE_GROUP, "scope_id"),
    "memory_fact_grants": Placement(SCOPE_GROUP, "scope_id"),
    "memory_fact_tags": Placement(SCOPE_GROUP, "scope_id"),
    "memory_fact_relations": Placement(SCOPE_GROUP, "scope_id"),
    # The user group: keyed by (tenant_id, user_id, ...), distributed by user_id.
    "memory_sessions": Placement(USER_GROUP, "user_id"),
    "memory_session_turns": Placement(USER_GROUP, "user_id"),
    "memory_store_items": Placement(USER_GROUP, "user_id"),
    "memory_store_item_history": Placement(USER_GROUP, "user_id"),
    "memory_agent_documents": Placement(USER_GROUP, "user_id"),
    "memory_agent_document_versions": Placement(USER_GROUP, "user_id"),
    # The durable queue is the fleet's scheduler: its claim orders every user's due rows, so it
    # stays whole on the coordinator (a Citus local table). It carries user_id all the same.
    "memory_queue": Placement(COORDINATOR, "user_id"),
    "memory_queue_claims": Placement(COORDINATOR, "user_id"),
    # Small, rarely written, read by every save's erasure fence: a copy on every node.
    "memory_erasures": Placement(REFERENCE, None),
}
"""Every table of the schema. tests/unit: the schema test checks that each carries its column."""

ROUTING_TABLE = "memory_scopes"
"""Where a scope's key (tenant_id, user_id, agent_name) becomes its distribution value (id)."""

_CONDITION_KEYS = ("Index Cond", "Recheck Cond", "Filter", "TID Cond")
_INSERT_COLUMNS = re.compile(r"^INSERT INTO (\w+) \(([^)]*)\)", re.IGNORECASE)
_EXPLAINABLE = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH")


@dataclass
class Sent:
    """One statement as the driver received it, with its (first) parameter set."""

    statement: str
    parameters: Any


@dataclass
class Verdict:
    """What one statement does to each distributed table it touches."""

    statement: str
    pinned: dict[str, str] = field(
        default_factory=dict
    )  # table -> how (constant, subquery, join, insert, key)
    unpinned: list[str] = field(default_factory=list)
    joined: set[str] = field(
        default_factory=set
    )  # tables joined to a co-located one on the distribution column


@contextmanager
def recorded(engine: type[Engine] | Engine = Engine) -> Iterator[list[Sent]]:
    """Every statement sent through ``engine`` (by default every engine of the process)."""
    seen: list[Sent] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, many: bool) -> None:
        seen.append(Sent(statement, parameters[0] if many and parameters else parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _plans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _plans(child)


_QUALIFIED = r"(?<![\w.'])(\w+)\.(\w+)(?![\w(])"
_JOIN = re.compile(rf"\(?{_QUALIFIED}\)?(?:::[\w ]+)?\s*=\s*\(?{_QUALIFIED}")


def _value_kind(text: str) -> str | None:
    """What pins a column: a constant or bound parameter, or a subquery's value."""
    text = text.strip()
    if re.match(r"^(ANY \()?\(?'", text) or re.match(r"^(ANY \()?-?\d", text) or text.startswith("ARRAY"):
        return "constant"
    if re.match(r"^(ANY \()?\$\d+", text) or text.startswith(("(InitPlan", "(SubPlan")):
        return "subquery"
    return None


def _pinned_by(condition: str, column: str, alias: str) -> str | None:
    """How ``condition`` pins ``alias.column`` (or an unqualified ``column``) to one value, if it does."""
    name = rf"(?<![\w.])(?:{re.escape(alias)}\.)?\(?{re.escape(column)}\)?(?:::\w+(?: \w+)*)?"
    kinds = [_value_kind(match.group(1)) for match in re.finditer(rf"{name}\s*=\s*(.+)", condition)]
    kinds += [
        _value_kind(match.group(1))
        for match in re.finditer(rf"('[^']*'(?:::\w+(?: \w+)*)?|\$\d+)\s*=\s*{name}(?!\w)", condition)
    ]
    for preferred in ("constant", "subquery"):
        if preferred in kinds:
            return preferred
    return None


def _keyed_scope_lookup(conditions: str) -> bool:
    """The routing table looked up by its key: tenant and user (COALESCE'd as the index has it)."""
    return "tenant_id" in conditions and re.search(r"user_id[^=]*=\s*'", conditions) is not None


def verdict_of(conn: psycopg.Connection[Any], sent: Sent) -> Verdict:
    """Plan ``sent`` and say, per distributed table it touches, whether one value pins it.

    A table joined on its distribution column to the distribution column of a co-located table
    is pinned when that table is (and is one multi-shard push-down with it when it is not).
    """
    verdict = Verdict(sent.statement)
    head = sent.statement.lstrip().split(None, 1)[0].upper()
    if head not in _EXPLAINABLE:
        return verdict
    with conn.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sent.statement, sent.parameters or None)
        row = cursor.fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    nodes = list(_plans(plan[0]["Plan"]))
    every_condition = " AND ".join(
        str(node[key])
        for node in nodes
        for key in (*_CONDITION_KEYS, "Hash Cond", "Merge Cond", "Join Filter")
        if key in node
    )
    scans: dict[str, str] = {}  # alias -> table, for the distributed tables scanned
    pairs: list[tuple[str, str, str, str]] = []  # (alias, column, other alias, other column)
    for node in nodes:
        table = node.get("Relation Name")
        if table is None or table not in LAYOUT:
            continue
        placement = LAYOUT[table]
        if not placement.distributed:
            verdict.pinned.setdefault(table, placement.group)
            continue
        if node.get("Node Type") == "ModifyTable":
            if node.get("Operation") == "Insert":
                columns = _INSERT_COLUMNS.match(sent.statement.strip())
                named = [column.strip() for column in columns.group(2).split(",")] if columns else []
                if placement.column in named or placement.column == "id":
                    # ``id`` from its sequence: Citus evaluates the default first, then routes the row.
                    verdict.pinned.setdefault(table, "insert")
                else:
                    verdict.unpinned.append(table)
            continue  # an UPDATE's or DELETE's rows come from its scan, checked below
        alias = node.get("Alias", table)
        scans[alias] = table
        conditions = " AND ".join(str(node[key]) for key in _CONDITION_KEYS if key in node)
        how = _pinned_by(conditions, str(placement.column), alias)
        if how is None and table == ROUTING_TABLE and _keyed_scope_lookup(conditions):
            how = "key"
        if how is not None:
            verdict.pinned[alias] = how
        # A scan's own columns are unqualified in its conditions: (scope_id = s.id).
        own = rf"(?<![\w.])(?:{re.escape(alias)}\.)?{re.escape(str(placement.column))}\)?(?:::[\w ]+)?"
        for other, other_column in re.findall(rf"{own}\s*=\s*\(?{_QUALIFIED}", conditions):
            pairs.append((alias, str(placement.column), other, other_column))
        for other, other_column in re.findall(
            rf"{_QUALIFIED}\)?(?:::[\w ]+)?\s*=\s*\(?{own}(?!\w)", conditions
        ):
            pairs.append((alias, str(placement.column), other, other_column))
    # Co-located joins: alias.column = other.column, both distribution columns of one group.
    links: dict[str, set[str]] = {alias: set() for alias in scans}
    for left, left_column, right, right_column in [*_JOIN.findall(every_condition), *pairs]:
        if left in scans and right in scans and left != right:
            one, other = LAYOUT[scans[left]], LAYOUT[scans[right]]
            if one.group == other.group and (left_column, right_column) == (one.column, other.column):
                links[left].add(right)
                links[right].add(left)
    reached = {alias for alias in scans if alias in verdict.pinned}
    frontier = list(reached)
    while frontier:
        for neighbour in links[frontier.pop()] - reached:
            reached.add(neighbour)
            verdict.pinned[neighbour] = "join"
            frontier.append(neighbour)
    verdict.joined = {scans[alias] for alias in scans if links[alias]}
    verdict.unpinned += [scans[alias] for alias in scans if alias not in reached]
    verdict.pinned = {scans.get(alias, alias): how for alias, how in verdict.pinned.items()}
    verdict.unpinned = sorted(set(verdict.unpinned))
    return verdict


def verdicts(url: str, sent: list[Sent]) -> list[Verdict]:
    """Every recorded statement's verdict, planned on a connection of its own."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [verdict_of(conn, one) for one in sent]
