"""The operator's reads of the LangGraph store's items (``memstore store list|show|history``).

Like ``ItemStore``, every read runs as the items' user in their tenant (``scoped.py``) on the
application's connection, so on PostgreSQL the row-level security of ``memory_store_items`` and
``memory_store_item_history`` holds it to that user's rows; memstore's own predicates say the same
on SQLite. Nothing here writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from memstore.config import MemoryConfig, get_memory_config
from memstore.document import as_utc
from memstore.errors import ConfigError, StorageUnavailableError
from memstore.storage.loader import load_storage_class
from memstore.storage.sql.documents.provider import SqlMemoryStorage
from memstore.storage.sql.engine import database_url_from_config
from memstore.storage.sql.schema.models import store_item_history_table as _history
from memstore.storage.sql.schema.models import store_items_table as _items
from memstore.storage.sql.scoped import ScopedConnections
from memstore.storage.sql.store_items.items import HISTORY_KEEP, ItemScope, Namespace, joined, split
from memstore.storage.sql.store_items.store import _scoped, _under


@dataclass(frozen=True)
class ItemSummary:
    """A live item as a listing shows it: no value, its size in characters of JSON."""

    namespace: Namespace
    key: str
    chars: int
    version: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class ItemDetail:
    namespace: Namespace
    key: str
    value: dict[str, Any]
    version: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class ItemChange:
    """One history row: a put (``value`` set) or a delete (``None``)."""

    version: int
    op: str
    value: dict[str, Any] | None
    changed_at: datetime


class ItemReads:
    def __init__(self, database_url: str) -> None:
        self._db = ScopedConnections(database_url, StorageUnavailableError, "store items")

    def list_items(
        self, scope: ItemScope, prefix: Namespace, *, limit: int, offset: int
    ) -> list[ItemSummary]:
        """A page of the scope's live items under ``prefix``, newest first (then namespace, key)."""
        column = _items.c
        where = [_scoped(_items, scope), column.deleted_at.is_(None)]
        under = _under(prefix)
        if under is not None:
            where.append(under)
        statement = (
            select(
                column.namespace,
                column.key,
                func.length(column.value).label("chars"),
                column.version,
                column.created_at,
                column.updated_at,
            )
            .where(*where)
            .order_by(column.updated_at.desc(), column.namespace, column.key)
            .limit(limit)
            .offset(offset)
        )
        with self._db.read(scope.identity, "list") as conn:
            rows = conn.execute(statement).all()
        return [
            ItemSummary(
                split(row.namespace),
                row.key,
                int(row.chars or 0),
                row.version,
                as_utc(row.created_at),
                as_utc(row.updated_at),
            )
            for row in rows
        ]

    def get_item(self, scope: ItemScope, namespace: Namespace, key: str) -> ItemDetail | None:
        """The live item, or ``None`` (never stored, or deleted)."""
        column = _items.c
        statement = select(column.value, column.version, column.created_at, column.updated_at).where(
            _scoped(_items, scope),
            column.namespace == joined(namespace),
            column.key == key,
            column.deleted_at.is_(None),
        )
        with self._db.read(scope.identity, "read") as conn:
            row = conn.execute(statement).first()
        if row is None:
            return None
        return ItemDetail(
            namespace, key, json.loads(row.value), row.version, as_utc(row.created_at), as_utc(row.updated_at)
        )

    def history(self, scope: ItemScope, namespace: Namespace, key: str) -> list[ItemChange]:
        """The item's kept history (its newest ``HISTORY_KEEP`` puts and deletes), newest first;
        a deleted item's too, until its tombstone is purged."""
        column = _history.c
        statement = (
            select(column.version, column.op, column.value, column.changed_at)
            .where(_scoped(_history, scope), column.namespace == joined(namespace), column.key == key)
            .order_by(column.version.desc())
            .limit(HISTORY_KEEP)
        )
        with self._db.read(scope.identity, "read history of") as conn:
            rows = conn.execute(statement).all()
        return [
            ItemChange(
                row.version,
                row.op,
                None if row.value is None else json.loads(row.value),
                as_utc(row.changed_at),
            )
            for row in rows
        ]


def item_reads(config: MemoryConfig | None = None) -> ItemReads:
    """The reads of the configured memory database; refuses a configuration without one."""
    config = config or get_memory_config()
    if not issubclass(load_storage_class(config.storage_class), SqlMemoryStorage):
        raise ConfigError(
            "LangGraph store items live in the memory database and need the SQL provider, but "
            f"storage_class is {config.storage_class}"
        )
    return ItemReads(database_url_from_config(config))
