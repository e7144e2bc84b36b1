"""``ItemStore``: the LangGraph store's items in the memory database, SQLite or PostgreSQL.

Every read runs as the items' user in their tenant (``scoped.py``), so on PostgreSQL the
row-level security of ``memory_store_items`` holds it to that user's rows whatever the statement
says; memstore's own predicates say the same on SQLite. A batch of writes is one transaction,
whoever's items it holds: it takes each user's lock first (PostgreSQL: the transaction lock an
erase of that user takes too, in one order, so two batches never wait for each other; SQLite:
``BEGIN IMMEDIATE``), sets each user's identity before writing that user's items, and either
lands whole or not at all, a cancelled or failed one included.

A search reads newest first (``updated_at``, then namespace and key). One with a filter or a
query reads keyset pages of ``PAGE_ROWS`` rows, each by its own statement, so it holds one page
plus the ``offset + limit`` items it keeps, however many items the scope has.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import ColumnElement, Connection, and_, bindparam, delete, func, insert, or_, select, update

from memstore.document import as_utc
from memstore.errors import StorageUnavailableError, StoreItemLimitError
from memstore.storage.sql.identity import set_identity
from memstore.storage.sql.maintenance.erase import lock_user
from memstore.storage.sql.schema.models import store_item_history_table as _history
from memstore.storage.sql.schema.models import store_items_table as _items
from memstore.storage.sql.schema.roles import UPDATABLE
from memstore.storage.sql.scoped import ScopedConnections
from memstore.storage.sql.search.embeddings import vector_matrix, vector_parameter
from memstore.storage.sql.store_items.items import (
    HISTORY_KEEP,
    MAX_CANDIDATES,
    SEPARATOR,
    ItemScope,
    ItemSearch,
    ItemWrite,
    MatchType,
    Namespace,
    Ranking,
    StoredItem,
    joined,
    matches,
    namespace_matches,
    split,
    term_score,
)

PAGE_ROWS = 500
PAIRS_PER_STATEMENT = 200
"""Items named in one statement (two bound values each, within SQLite's 999)."""
_ITEM = (_items.c.namespace, _items.c.key, _items.c.value, _items.c.created_at, _items.c.updated_at)
Pair = tuple[Namespace, str]


def _scoped(table: Any, scope: ItemScope) -> ColumnElement[bool]:
    return and_(
        table.c.tenant_id == scope.tenant_id,
        table.c.user_id == scope.user_id,
        table.c.agent_name == scope.agent_name,
    )


def _named(table: Any, pairs: Sequence[Pair]) -> ColumnElement[bool]:
    return or_(*(and_(table.c.namespace == joined(ns), table.c.key == key) for ns, key in pairs))


def _under(prefix: Namespace) -> ColumnElement[bool] | None:
    """The namespaces ``prefix`` covers, as a range the primary key serves: code point order puts
    every ``p.…`` between ``p.`` and ``p/`` (``/`` follows ``.``)."""
    if not prefix:
        return None
    text = joined(prefix)
    below = chr(ord(SEPARATOR) + 1)
    column = _items.c.namespace
    return or_(column == text, and_(column >= text + SEPARATOR, column < text + below))


def _chunks(pairs: Sequence[Pair]) -> Iterator[Sequence[Pair]]:
    for start in range(0, len(pairs), PAIRS_PER_STATEMENT):
        yield pairs[start : start + PAIRS_PER_STATEMENT]


def _item(row: Any, score: float | None = None) -> StoredItem:
    return StoredItem(
        split(row.namespace),
        row.key,
        json.loads(row.value),
        as_utc(row.created_at),
        as_utc(row.updated_at),
        score,
    )


class ItemStore:
    def __init__(self, database_url: str) -> None:
        self._db = ScopedConnections(database_url, StorageUnavailableError, "store items")

    def get(self, scope: ItemScope, pairs: Sequence[Pair]) -> dict[Pair, StoredItem]:
        """The live items named by ``pairs`` (those that exist)."""
        found: dict[Pair, StoredItem] = {}
        with self._db.read(scope.identity, "read") as conn:
            for chunk in _chunks(pairs):
                rows = conn.execute(
                    select(*_ITEM).where(
                        _scoped(_items, scope), _items.c.deleted_at.is_(None), _named(_items, chunk)
                    )
                )
                for row in rows:
                    item = _item(row)
                    found[(item.namespace, item.key)] = item
        return found

    def search(self, scope: ItemScope, search: ItemSearch) -> list[StoredItem]:
        """A page of the live items under ``search.prefix`` that match its filter: newest first, or
        by ``search.ranking`` (scored items first, best first, then the unscored newest first)."""
        with self._db.read(scope.identity, "search") as conn:
            if search.filter is None and search.ranking is None:
                rows = conn.execute(
                    self._scan(scope, search.prefix, ()).limit(search.limit).offset(search.offset)
                )
                return [_item(row) for row in rows]
            candidates = self._candidates(conn, scope, search)
            if search.ranking is None:
                page = [row for _, row in zip(range(search.offset + search.limit), candidates, strict=False)]
                return [_item(row) for row in page[search.offset :]]
            ranking = search.ranking
            ranked = (
                (_score(conn.dialect.name, ranking, row), position, row)
                for position, row in zip(range(MAX_CANDIDATES), candidates, strict=False)
            )
            best = heapq.nsmallest(search.offset + search.limit, ranked, key=_rank_key)
        return [_item(row, score) for score, _, row in best[search.offset :]]

    def _scan(self, scope: ItemScope, prefix: Namespace, extra: Sequence[Any]) -> Any:
        where = [_scoped(_items, scope), _items.c.deleted_at.is_(None)]
        under = _under(prefix)
        if under is not None:
            where.append(under)
        return (
            select(*_ITEM, *extra)
            .where(*where)
            .order_by(_items.c.updated_at.desc(), _items.c.namespace, _items.c.key)
        )

    def _candidates(self, conn: Connection, scope: ItemScope, search: ItemSearch) -> Iterator[Any]:
        """The live items under the prefix that match the filter, newest first, a page at a time."""
        extra: list[Any] = []
        if search.ranking is not None and search.ranking.vector is not None:
            raw = (
                func.array_send(_items.c.embedding)
                if conn.dialect.name == "postgresql"
                else _items.c.embedding
            )
            extra = [_items.c.model, _items.c.dimension, raw.label("raw")]
        elif search.ranking is not None:
            extra = [_items.c.indexed_text]
        statement = self._scan(scope, search.prefix, extra)
        after: Any = None
        while True:
            page = statement if after is None else statement.where(_after(after))
            rows = conn.execute(page.limit(PAGE_ROWS)).all()
            for row in rows:
                if search.filter is None or matches(json.loads(row.value), search.filter):
                    yield row
            if len(rows) < PAGE_ROWS:
                return
            after = rows[-1]

    def list_namespaces(
        self,
        scope: ItemScope,
        conditions: Sequence[tuple[MatchType, Namespace]],
        *,
        max_depth: int | None,
        limit: int,
        offset: int,
    ) -> list[Namespace]:
        """The scope's namespaces holding live items that meet every condition, cut to
        ``max_depth`` labels, in order (label by label, by code point), one page of them."""
        prefix = _literal_prefix(conditions)
        where = [_scoped(_items, scope), _items.c.deleted_at.is_(None)]
        under = _under(prefix)
        if under is not None:
            where.append(under)
        with self._db.read(scope.identity, "list") as conn:
            texts = conn.execute(select(_items.c.namespace).where(*where).distinct()).scalars().all()
        found = {
            namespace[:max_depth] if max_depth is not None else namespace
            for namespace in map(split, texts)
            if namespace_matches(namespace, conditions)
        }
        return sorted(found)[offset : offset + limit]

    def write(self, writes: Sequence[ItemWrite], *, now: datetime, max_items: int) -> None:
        """Apply the puts and deletes (at most one per item) in one transaction."""
        scopes = sorted(
            {write.scope for write in writes}, key=lambda s: (s.tenant_id, s.user_id, s.agent_name)
        )
        if not scopes:
            return
        with self._db.write(scopes[0].identity, "write") as conn:
            for tenant_id, user_id in sorted({(s.tenant_id, s.user_id) for s in scopes}):
                lock_user(conn, user_id, tenant_id)
            for index, scope in enumerate(scopes):
                if index and scope.identity != scopes[index - 1].identity:
                    set_identity(conn, scope.identity)
                _write_scope(conn, scope, [w for w in writes if w.scope == scope], now, max_items)


def _after(row: Any) -> ColumnElement[bool]:
    """Rows after ``row`` in the scan's order (``updated_at`` descending, namespace, key)."""
    column = _items.c
    return or_(
        column.updated_at < row.updated_at,
        and_(
            column.updated_at == row.updated_at,
            or_(
                column.namespace > row.namespace,
                and_(column.namespace == row.namespace, column.key > row.key),
            ),
        ),
    )


def _literal_prefix(conditions: Sequence[tuple[MatchType, Namespace]]) -> Namespace:
    """The leading labels (up to a wildcard) of the first prefix condition: what SQL can narrow by."""
    for match_type, path in conditions:
        if match_type == "prefix":
            labels: list[str] = []
            for label in path:
                if label == "*":
                    break
                labels.append(label)
            return tuple(labels)
    return ()


def _score(dialect: str, ranking: Ranking, row: Any) -> float | None:
    if ranking.vector is None:
        return term_score(ranking.terms, row.indexed_text)
    if row.raw is None or row.model != ranking.model or row.dimension != len(ranking.vector):
        return None
    vector = vector_matrix([row.raw], row.dimension, dialect)[0]
    return float(np.dot(vector, ranking.vector))


def _rank_key(entry: tuple[float | None, int, Any]) -> tuple[int, float, int]:
    score, position, _ = entry
    return (1, 0.0, position) if score is None else (0, -score, position)


_KEY = ("tenant_id", "user_id", "agent_name", "namespace", "key")
_COLUMNS = UPDATABLE["memory_store_items"]
"""The columns an overwrite sets: the ones the application role is granted to update."""


def _keyed(table: Any) -> ColumnElement[bool]:
    return and_(*(table.c[name] == bindparam(f"k_{name}") for name in _KEY))


_UPDATE = (
    update(_items)
    .where(_keyed(_items))
    .values({name: bindparam(f"v_{name}", type_=_items.c[name].type) for name in _COLUMNS})
)
_PRUNE = delete(_history).where(_keyed(_history), _history.c.version <= bindparam("oldest"))


@dataclass(frozen=True)
class _Change:
    """What one write does to its item: the row's key and its columns afterwards."""

    key: dict[str, str]
    columns: dict[str, Any]
    new: bool

    @property
    def version(self) -> int:
        return int(self.columns["version"])


def _write_scope(
    conn: Connection, scope: ItemScope, writes: list[ItemWrite], now: datetime, max_items: int
) -> None:
    """The scope's puts and deletes: rows inserted or updated (a delete keeps its row as a
    tombstone), one history row each, each item's history pruned to its newest ``HISTORY_KEEP``."""
    stored: dict[Pair, Any] = {}
    state = (_items.c.namespace, _items.c.key, _items.c.version, _items.c.created_at, _items.c.deleted_at)
    for chunk in _chunks([(write.namespace, write.key) for write in writes]):
        for found in conn.execute(select(*state).where(_scoped(_items, scope), _named(_items, chunk))):
            stored[(split(found.namespace), found.key)] = found
    changes: list[_Change] = []
    revived: set[Pair] = set()
    grows = 0
    for write in writes:
        pair = (write.namespace, write.key)
        row = stored.get(pair)
        live = row is not None and row.deleted_at is None
        if write.value_text is None and not live:
            continue  # deleting what is not there changes nothing
        columns = _put(conn, write, now) if write.value_text is not None else _tombstone(now)
        columns["version"] = 1 if row is None else row.version + 1
        columns["created_at"] = row.created_at if row is not None and live else now
        if row is not None and not live:
            revived.add(pair)
        if write.value_text is None:
            grows -= 1
        elif not live:
            grows += 1
        key = {"tenant_id": scope.tenant_id, "user_id": scope.user_id, "agent_name": scope.agent_name}
        changes.append(
            _Change({**key, "namespace": joined(write.namespace), "key": write.key}, columns, row is None)
        )
    added = sum(change.new for change in changes)
    if added or revived:
        _make_room(conn, scope, grows=grows, added=added, keep=revived, max_items=max_items)
    # Single statements, never a driver's executemany: psycopg's async executemany, cancelled as it
    # enters its pipeline, fails with an AssertionError instead of the task's CancelledError.
    _insert_rows(conn, _items, [{**c.key, **c.columns} for c in changes if c.new])
    for change in changes:
        if not change.new:
            conn.execute(_UPDATE, {**_prefixed("k_", change.key), **_prefixed("v_", change.columns)})
    _insert_rows(
        conn,
        _history,
        [
            {
                **c.key,
                "version": c.version,
                "op": "delete" if c.columns["value"] is None else "put",
                "value": c.columns["value"],
                "changed_at": now,
            }
            for c in changes
        ],
    )
    for change in changes:
        if change.version > HISTORY_KEEP:
            conn.execute(_PRUNE, {**_prefixed("k_", change.key), "oldest": change.version - HISTORY_KEEP})


def _prefixed(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}{name}": value for name, value in values.items()}


def _insert_rows(conn: Connection, table: Any, rows: list[dict[str, Any]]) -> None:
    """``rows`` as multi-row INSERTs, each within the 999 values every SQLite build binds."""
    if not rows:
        return
    per_statement = max(1, 900 // len(rows[0]))
    for start in range(0, len(rows), per_statement):
        conn.execute(insert(table).values(rows[start : start + per_statement]))


def _put(conn: Connection, write: ItemWrite, now: datetime) -> dict[str, Any]:
    vector = write.vector
    return {
        "value": write.value_text,
        "indexed_text": write.indexed_text,
        "model": None if vector is None else write.model,
        "dimension": None if vector is None else len(vector),
        "embedding": None if vector is None else vector_parameter(conn.dialect.name, vector),
        "updated_at": now,
        "deleted_at": None,
    }


def _tombstone(now: datetime) -> dict[str, Any]:
    return {
        **dict.fromkeys(("value", "indexed_text", "model", "dimension", "embedding")),
        "updated_at": now,
        "deleted_at": now,
    }


def _make_room(
    conn: Connection, scope: ItemScope, *, grows: int, added: int, keep: set[Pair], max_items: int
) -> None:
    """Refuse a batch that would take the scope past ``max_items`` live items (``grows``: how
    many more it would hold). A deleted item keeps its row and history, so once the scope would
    hold ``2 × max_items`` rows the longest-deleted ones go, history and all: storage stays
    bounded however many items are created and deleted."""
    total, deleted = conn.execute(
        select(func.count(), func.count(_items.c.deleted_at)).where(_scoped(_items, scope))
    ).one()
    live = total - deleted
    if live + grows > max_items:
        raise StoreItemLimitError(
            f"the batch would leave {live + grows} items in one scope, over its max_items of {max_items}: "
            "delete some first"
        )
    excess = total + added - 2 * max_items
    if excess <= 0:
        return
    oldest = conn.execute(
        select(_items.c.namespace, _items.c.key)
        .where(_scoped(_items, scope), _items.c.deleted_at.is_not(None))
        .order_by(_items.c.deleted_at, _items.c.namespace, _items.c.key)
        .limit(excess + len(keep))
    ).all()
    purged = [pair for pair in ((split(row.namespace), row.key) for row in oldest) if pair not in keep][
        :excess
    ]
    for chunk in _chunks(purged):
        conn.execute(delete(_history).where(_scoped(_history, scope), _named(_history, chunk)))
        conn.execute(delete(_items).where(_scoped(_items, scope), _named(_items, chunk)))
