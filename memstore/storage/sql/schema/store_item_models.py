"""The LangGraph store's items (revision 0012): one row per item, and the audit history of each.

An item is ``(tenant_id, user_id, agent_name, namespace, key)``: ``agent_name`` ``''`` when the
store names no agent; ``namespace`` is the LangGraph namespace's labels joined by ``.``, which no
label may contain, so the join is injective and a namespace prefix is a text prefix. Both
``namespace`` and ``key`` compare by code point on both dialects (``COLLATE "C"`` on PostgreSQL;
SQLite's ``BINARY`` is that already), so the primary key serves a prefix scan as a range and an
order is the same on SQLite and PostgreSQL.

``value`` is the item's JSON text, exactly as written; a deleted item keeps its row with
``deleted_at`` set and no value, so its ``version`` (the number of its history rows) goes on if it
is written again, until the scope needs the room. ``indexed_text`` is what a query ranks the item
by (``NULL``: not indexed); ``embedding`` its vector under ``model`` when embeddings are
configured.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import CheckConstraint, Index, Integer, String, Text, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Mapped, mapped_column

from memstore.storage.sql.schema.base import Base, TenantId, Timestamp, Vector

CodePointText = Text().with_variant(postgresql.TEXT(collation="C"), "postgresql")
CodePointKey = String(512).with_variant(postgresql.VARCHAR(512, collation="C"), "postgresql")


class MemoryStoreItem(Base):
    __tablename__ = "memory_store_items"

    tenant_id: Mapped[str] = mapped_column(TenantId, primary_key=True, server_default=text("'default'"))
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_name: Mapped[str] = mapped_column(String(128), primary_key=True)
    namespace: Mapped[str] = mapped_column(CodePointText, primary_key=True)
    key: Mapped[str] = mapped_column(CodePointKey, primary_key=True)
    value: Mapped[str | None] = mapped_column(Text)
    indexed_text: Mapped[str | None] = mapped_column(Text)
    model: Mapped[str | None] = mapped_column(String(255))
    dimension: Mapped[int | None] = mapped_column(Integer)
    embedding: Mapped[Any] = mapped_column(Vector, nullable=True)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    deleted_at: Mapped[datetime | None] = mapped_column(Timestamp)

    __table_args__ = (
        CheckConstraint("version >= 1", name="positive_version"),
        CheckConstraint("(deleted_at IS NULL) = (value IS NOT NULL)", name="value_while_live"),
        CheckConstraint(
            "(embedding IS NULL) = (dimension IS NULL) AND (embedding IS NULL) = (model IS NULL)",
            name="vector_described",
        ),
        Index(
            "ix_memory_store_items_tenant_id_user_id_agent_name_updated_at",
            "tenant_id",
            "user_id",
            "agent_name",
            "updated_at",
        ),
    )


class MemoryStoreItemHistory(Base):
    __tablename__ = "memory_store_item_history"

    tenant_id: Mapped[str] = mapped_column(TenantId, primary_key=True, server_default=text("'default'"))
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_name: Mapped[str] = mapped_column(String(128), primary_key=True)
    namespace: Mapped[str] = mapped_column(CodePointText, primary_key=True)
    key: Mapped[str] = mapped_column(CodePointKey, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    op: Mapped[str] = mapped_column(String(8), nullable=False)
    value: Mapped[str | None] = mapped_column(Text)
    changed_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)

    __table_args__ = (
        CheckConstraint("op IN ('put', 'delete')", name="known_op"),
        CheckConstraint("(op = 'put') = (value IS NOT NULL)", name="value_of_put"),
    )
