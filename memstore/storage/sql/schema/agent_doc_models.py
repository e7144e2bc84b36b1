"""The agent's own documents (revision 0011): the live documents and every version of them.

``user_id`` holds ``''`` for the agent's own documents (shared by its users) and the user's id
for a user's documents of that agent (``agent_doc_per_user``); ``agent_name`` ``''`` is the
unnamed agent, as in the sessions. A deleted document keeps its row with ``deleted_at`` set, so
its versions go on from where they were if it is written again and a stale writer that read it
before the delete gets a conflict, not a fresh document.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from memstore.storage.sql.schema.base import Base, TenantId, Timestamp


class MemoryAgentDocument(Base):
    __tablename__ = "memory_agent_documents"

    tenant_id: Mapped[str] = mapped_column(TenantId, primary_key=True, server_default=text("'default'"))
    agent_name: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    path: Mapped[str] = mapped_column(String(256), primary_key=True)
    content: Mapped[str] = mapped_column(Text, nullable=False)
    chars: Mapped[int] = mapped_column(Integer, nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    author: Mapped[str] = mapped_column(String(16), nullable=False)
    actor: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)
    deleted_at: Mapped[datetime | None] = mapped_column(Timestamp)

    __table_args__ = (
        CheckConstraint("author IN ('agent', 'user', 'operator', 'import')", name="known_author"),
        CheckConstraint("version >= 1", name="positive_version"),
        Index("ix_memory_agent_documents_tenant_id_user_id", "tenant_id", "user_id"),
    )


class MemoryAgentDocumentVersion(Base):
    __tablename__ = "memory_agent_document_versions"

    tenant_id: Mapped[str] = mapped_column(TenantId, primary_key=True, server_default=text("'default'"))
    agent_name: Mapped[str] = mapped_column(String(128), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    path: Mapped[str] = mapped_column(String(256), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    action: Mapped[str] = mapped_column(String(8), nullable=False)
    author: Mapped[str] = mapped_column(String(16), nullable=False)
    actor: Mapped[str | None] = mapped_column(String(128))
    content: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)

    __table_args__ = (
        CheckConstraint("action IN ('write', 'edit', 'delete')", name="known_action"),
        CheckConstraint("author IN ('agent', 'user', 'operator', 'import')", name="known_author"),
        Index("ix_memory_agent_document_versions_tenant_id_actor", "tenant_id", "actor"),
    )
