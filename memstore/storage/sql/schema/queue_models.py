"""The durable update queue's tables: pending conversations and the per-scope claims."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, CheckConstraint, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from memstore.storage.sql.schema.base import Base, Id, Json, TenantId, Timestamp, tenant_column


class MemoryQueueItem(Base):
    """One pending conversation of the durable update queue, keyed by thread, user and agent.

    ``user_id`` and ``agent_name`` hold ``''`` for "none" (never a valid id), so the plain unique
    key coalesces repeated turns of a conversation. ``generation`` grows with every enqueue: a
    worker that finishes an older generation puts the row back to ``pending`` instead of ``done``.
    """

    __tablename__ = "memory_queue"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    tenant_id: Mapped[str] = tenant_column()
    # ``conversation`` (a turn to learn from) or ``session_compress`` (a session due for
    # compression, ``thread_id`` holding its id).
    kind: Mapped[str] = mapped_column(String(16), nullable=False, server_default=text("'conversation'"))
    thread_id: Mapped[str] = mapped_column(String(255), nullable=False)
    user_id: Mapped[str] = mapped_column(String(128), nullable=False)
    agent_name: Mapped[str] = mapped_column(String(128), nullable=False)
    messages: Mapped[list[Any]] = mapped_column(Json, nullable=False)
    # The characters of the messages' text: what ``max_queue_chars`` and a user's share count.
    message_chars: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    correction_detected: Mapped[bool] = mapped_column(Boolean, nullable=False)
    reinforcement_detected: Mapped[bool] = mapped_column(Boolean, nullable=False)
    state: Mapped[str] = mapped_column(String(8), nullable=False)
    generation: Mapped[int] = mapped_column(Integer, nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    # Failures that retrying will not fix (a malformed reply): dead at ``update_max_attempts``.
    failures: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    captured_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    # When the oldest turn not yet processed arrived (the queue's lag is measured from it).
    pending_since: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    due_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    # pending_since + 2 x debounce: however busy the conversation, it is due by then.
    latest_due_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    # A retry's backoff (or the endpoint's Retry-After): no new turn brings ``due_at`` before it.
    not_before: Mapped[datetime | None] = mapped_column(Timestamp)
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_token: Mapped[str | None] = mapped_column(String(32))
    lease_expires_at: Mapped[datetime | None] = mapped_column(Timestamp)
    enqueued_by: Mapped[str] = mapped_column(String(128), nullable=False)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    completed_at: Mapped[datetime | None] = mapped_column(Timestamp)

    __table_args__ = (
        CheckConstraint("state IN ('pending', 'leased', 'done', 'dead')", name="known_state"),
        CheckConstraint("kind IN ('conversation', 'session_compress')", name="known_kind"),
        Index(
            "uq_memory_queue_conversation",
            "tenant_id",
            "kind",
            "thread_id",
            "user_id",
            "agent_name",
            unique=True,
        ),
        Index("ix_memory_queue_state_due_at", "state", "due_at"),
        Index("ix_memory_queue_tenant_id_user_id_agent_name", "tenant_id", "user_id", "agent_name"),
    )


class MemoryQueueClaim(Base):
    """At most one row per scope: the worker holding it is the only one processing that scope.

    The primary key is what enforces it (a claim is an INSERT, or the take-over of an expired
    row), not a check followed by a write.
    """

    __tablename__ = "memory_queue_claims"

    tenant_id: Mapped[str] = mapped_column(TenantId, primary_key=True, server_default=text("'default'"))
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    agent_name: Mapped[str] = mapped_column(String(128), primary_key=True)
    lease_owner: Mapped[str] = mapped_column(String(128), nullable=False)
    lease_token: Mapped[str] = mapped_column(String(32), nullable=False)
    lease_expires_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    claimed_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
