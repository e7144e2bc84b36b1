"""Short-term session memory's tables (revision 0010): one row per session, one per turn.

``user_id`` and ``agent_name`` hold ``''`` for "none", as in the queue, so the plain primary key
identifies a session. ``turn_count`` and ``token_count`` count the raw turns (not the summary):
what compression is due on. ``next_seq`` is the last turn number handed out: an append bumps it
in the same statement that creates or locks the session row, so two replicas never take one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Text,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from memstore.storage.sql.schema.base import Base, NullableJson, TenantId, Timestamp

_KEY = ("tenant_id", "user_id", "agent_name", "session_id")


class MemorySession(Base):
    __tablename__ = "memory_sessions"

    tenant_id: Mapped[str] = mapped_column(TenantId, primary_key=True, server_default=text("'default'"))
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_name: Mapped[str] = mapped_column(String(128), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    epoch: Mapped[str] = mapped_column(String(16), nullable=False)
    next_seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    turn_count: Mapped[int] = mapped_column(Integer, nullable=False)
    token_count: Mapped[int] = mapped_column(Integer, nullable=False)
    summary_seq: Mapped[int | None] = mapped_column(BigInteger)
    compressions: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    expires_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)

    __table_args__ = (
        Index("ix_memory_sessions_tenant_id_user_id_updated_at", "tenant_id", "user_id", "updated_at"),
        Index("ix_memory_sessions_expires_at", "expires_at"),
    )


class MemorySessionTurn(Base):
    __tablename__ = "memory_session_turns"

    tenant_id: Mapped[str] = mapped_column(TenantId, primary_key=True, server_default=text("'default'"))
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_name: Mapped[str] = mapped_column(String(128), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    content: Mapped[str] = mapped_column(Text, nullable=False)
    name: Mapped[str | None] = mapped_column(String(128))
    tool_calls: Mapped[list[Any] | None] = mapped_column(NullableJson)
    tokens: Mapped[int] = mapped_column(Integer, nullable=False)
    is_summary: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)

    __table_args__ = (
        CheckConstraint("role IN ('user', 'assistant', 'system', 'tool')", name="known_role"),
        ForeignKeyConstraint(
            list(_KEY),
            [f"memory_sessions.{column}" for column in _KEY],
            ondelete="CASCADE",
        ),
    )
