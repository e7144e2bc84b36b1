"""The normalised schema. Alembic revisions are generated from, and checked against, this metadata.

Scopes own sections and facts; facts are never physically deleted by a save but tombstoned
with the revision that removed them, which is what lets a stale writer's save be merged
instead of resurrecting what another writer deleted.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    CheckConstraint,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    String,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from memstore.storage.sql.schema.agent_doc_models import MemoryAgentDocument, MemoryAgentDocumentVersion
from memstore.storage.sql.schema.base import (
    NAMING_CONVENTION,
    Base,
    Id,
    Json,
    NullableJson,
    TenantId,
    Timestamp,
    Vector,
    tenant_column,
)
from memstore.storage.sql.schema.queue_models import MemoryQueueClaim, MemoryQueueItem
from memstore.storage.sql.schema.session_models import MemorySession, MemorySessionTurn
from memstore.storage.sql.schema.store_item_models import MemoryStoreItem, MemoryStoreItemHistory

__all__ = ["NAMING_CONVENTION", "Base", "Json", "TenantId", "Timestamp"]


class MemoryScope(Base):
    """One row per ``(tenant_id, user_id, agent_name)``; user and agent may be NULL (global scopes).

    The scope's user owns it: its sections, its facts and their history. Row-level security on
    PostgreSQL (``rls.py``) keys every memory table on the tenant and that owner.
    """

    __tablename__ = "memory_scopes"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    tenant_id: Mapped[str] = tenant_column()
    user_id: Mapped[str | None] = mapped_column(String(128))
    agent_name: Mapped[str | None] = mapped_column(String(128))
    revision: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    version: Mapped[str] = mapped_column(String(16), nullable=False, server_default="1.0")
    created_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, server_default=func.now())
    # Set by a clear: a queued update captured before this time must not refill the scope.
    cleared_at: Mapped[datetime | None] = mapped_column(Timestamp)
    # Highest revision whose tombstones ``vacuum`` purged: older documents can no longer be merged.
    purged_revision: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))

    __table_args__ = (
        CheckConstraint("revision >= 0", name="revision_non_negative"),
        # NULL never equals NULL in a plain unique index, so key on COALESCE: '' is not a valid id.
        Index(
            "uq_memory_scopes_scope",
            "tenant_id",
            func.coalesce(text("user_id"), text("''")),
            func.coalesce(text("agent_name"), text("''")),
            unique=True,
        ),
        Index("ix_memory_scopes_agent_name", "agent_name"),
    )


class MemorySection(Base):
    """One of the six summaries of a scope (``workContext`` ... ``longTermBackground``)."""

    __tablename__ = "memory_sections"

    scope_id: Mapped[int] = mapped_column(
        Id, ForeignKey("memory_scopes.id", ondelete="CASCADE"), primary_key=True
    )
    section: Mapped[str] = mapped_column(String(32), primary_key=True)
    summary: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    updated_at: Mapped[datetime | None] = mapped_column(Timestamp)
    revision: Mapped[int] = mapped_column(Integer, nullable=False)
    extra: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False, default=dict)

    __table_args__ = (
        CheckConstraint(
            "section IN ('workContext', 'personalContext', 'topOfMind', "
            "'recentMonths', 'earlierContext', 'longTermBackground')",
            name="known_section",
        ),
    )


class MemoryFact(Base):
    """One fact of a scope. ``deleted_revision`` set means tombstoned (not part of the document).

    ``visibility`` says who else in the tenant reads it: ``private`` (the owner only), ``shared``
    (the users and roles in ``memory_fact_grants``) or ``public`` (everyone in the tenant).
    ``tenant_id`` repeats the scope's, so the policies and the tenant's shared reads need no join.
    """

    __tablename__ = "memory_facts"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    scope_id: Mapped[int] = mapped_column(
        Id, ForeignKey("memory_scopes.id", ondelete="CASCADE"), nullable=False
    )
    tenant_id: Mapped[str] = tenant_column()
    visibility: Mapped[str] = mapped_column(String(8), nullable=False, server_default="private")
    fact_id: Mapped[str] = mapped_column(String(64), nullable=False)
    position: Mapped[int] = mapped_column(Integer, nullable=False)
    content: Mapped[str] = mapped_column(Text, nullable=False)
    content_key: Mapped[str] = mapped_column(Text, nullable=False)
    category: Mapped[str] = mapped_column(String(64), nullable=False)
    confidence: Mapped[float] = mapped_column(Float, nullable=False)
    created_at: Mapped[datetime | None] = mapped_column(Timestamp)
    source: Mapped[str | None] = mapped_column(String(255))
    source_error: Mapped[str | None] = mapped_column(Text)
    extra: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False, default=dict)
    added_revision: Mapped[int] = mapped_column(Integer, nullable=False)
    updated_revision: Mapped[int] = mapped_column(Integer, nullable=False)
    deleted_revision: Mapped[int | None] = mapped_column(Integer)
    deleted_at: Mapped[datetime | None] = mapped_column(Timestamp)
    # Retention signals (``memstore.retention``): not content, so writing them bumps no revision.
    last_confirmed_at: Mapped[datetime | None] = mapped_column(Timestamp)
    last_accessed_at: Mapped[datetime | None] = mapped_column(Timestamp)
    access_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    # The memory record (``memstore.record``); existing facts take the documented defaults.
    memory_type: Mapped[str] = mapped_column(String(16), nullable=False, server_default="semantic")
    importance: Mapped[float] = mapped_column(Float, nullable=False, server_default=text("0.5"))
    source_kind: Mapped[str] = mapped_column(String(24), nullable=False, server_default="implicit_inference")
    raw: Mapped[str | None] = mapped_column(Text)
    structured: Mapped[dict[str, Any] | None] = mapped_column(NullableJson)
    # Bumped by every change to the fact's document; the history holds each version.
    version: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("1"))

    __table_args__ = (
        CheckConstraint("confidence >= 0 AND confidence <= 1", name="confidence_range"),
        CheckConstraint("importance >= 0 AND importance <= 1", name="importance_range"),
        CheckConstraint(
            "memory_type IN ('episodic', 'semantic', 'procedural', 'preference', 'profile')",
            name="known_memory_type",
        ),
        CheckConstraint(
            "source_kind IN ('explicit_user_input', 'implicit_inference', 'system_generated', "
            "'external_data', 'corrected_memory')",
            name="known_source_kind",
        ),
        CheckConstraint("version >= 1", name="version_positive"),
        CheckConstraint("length(content) > 0", name="content_not_empty"),
        CheckConstraint("visibility IN ('private', 'shared', 'public')", name="known_visibility"),
        Index("uq_memory_facts_scope_id_fact_id", "scope_id", "fact_id", unique=True),
        # The target of memory_fact_grants' (fact_row_id, scope_id) foreign key.
        Index("uq_memory_facts_id_scope_id", "id", "scope_id", unique=True),
        # Dedup is race-free because the database refuses a second live fact with the same key.
        Index(
            "uq_memory_facts_live_content_key",
            "scope_id",
            "content_key",
            unique=True,
            sqlite_where=text("deleted_revision IS NULL"),
            postgresql_where=text("deleted_revision IS NULL"),
        ),
        Index("ix_memory_facts_scope_id_category", "scope_id", "category"),
        Index("ix_memory_facts_created_at", "created_at"),
        Index("ix_memory_facts_category_created_at", "category", "created_at"),
        # Live facts per category (``stats``) without visiting a million rows for deleted_revision.
        Index(
            "ix_memory_facts_live_category",
            "category",
            sqlite_where=text("deleted_revision IS NULL"),
            postgresql_where=text("deleted_revision IS NULL"),
        ),
        # The tenant's shared and public facts (``memory_context``'s merge) without its private ones.
        Index(
            "ix_memory_facts_tenant_id_visibility",
            "tenant_id",
            "visibility",
            sqlite_where=text("deleted_revision IS NULL AND visibility <> 'private'"),
            postgresql_where=text("deleted_revision IS NULL AND (visibility)::text <> 'private'::text"),
        ),
    )


class MemoryFactGrant(Base):
    """Who a ``shared`` fact is granted to: one row per user or role, inside the fact's tenant.

    ``scope_id`` and ``tenant_id`` repeat the fact's, so the owner's policy needs no join to it.
    """

    __tablename__ = "memory_fact_grants"

    fact_row_id: Mapped[int] = mapped_column(Id, primary_key=True)
    grantee_kind: Mapped[str] = mapped_column(String(4), primary_key=True)
    grantee: Mapped[str] = mapped_column(String(128), primary_key=True)
    scope_id: Mapped[int] = mapped_column(
        Id, ForeignKey("memory_scopes.id", ondelete="CASCADE"), nullable=False
    )
    tenant_id: Mapped[str] = tenant_column()

    __table_args__ = (
        CheckConstraint("grantee_kind IN ('user', 'role')", name="known_grantee_kind"),
        # The grant's scope is its fact's: the owner's policy on scope_id then covers the fact, and
        # nobody can attach a grant to another owner's fact under a scope of their own.
        ForeignKeyConstraint(
            ["fact_row_id", "scope_id"],
            ["memory_facts.id", "memory_facts.scope_id"],
            ondelete="CASCADE",
            name="fk_memory_fact_grants_fact_row_id_scope_id_memory_facts",
        ),
        Index("ix_memory_fact_grants_tenant_id_grantee_kind_grantee", "tenant_id", "grantee_kind", "grantee"),
        Index("ix_memory_fact_grants_scope_id", "scope_id"),
    )


class MemoryFactTag(Base):
    """One tag of a fact; ``scope_id`` and ``tenant_id`` repeat the fact's, as for grants."""

    __tablename__ = "memory_fact_tags"

    fact_row_id: Mapped[int] = mapped_column(Id, primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True)
    scope_id: Mapped[int] = mapped_column(
        Id, ForeignKey("memory_scopes.id", ondelete="CASCADE"), nullable=False
    )
    tenant_id: Mapped[str] = tenant_column()

    __table_args__ = (
        ForeignKeyConstraint(
            ["fact_row_id", "scope_id"],
            ["memory_facts.id", "memory_facts.scope_id"],
            ondelete="CASCADE",
            name="fk_memory_fact_tags_fact_row_id_scope_id_memory_facts",
        ),
        Index("ix_memory_fact_tags_tenant_id_tag", "tenant_id", "tag"),
        Index("ix_memory_fact_tags_scope_id", "scope_id"),
    )


class MemoryFactRelation(Base):
    """``fact_id`` relates to ``target_fact_id`` (both facts of one scope, live or tombstoned).

    Keyed by fact id, not row, so a document states its relations as it states its facts; both
    ends are foreign keys to ``memory_facts (scope_id, fact_id)``, so a purged fact takes its
    relations with it on both dialects.
    """

    __tablename__ = "memory_fact_relations"

    scope_id: Mapped[int] = mapped_column(
        Id, ForeignKey("memory_scopes.id", ondelete="CASCADE"), primary_key=True
    )
    fact_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    target_fact_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = tenant_column()

    __table_args__ = (
        CheckConstraint(
            "kind IN ('related_to', 'supersedes', 'derived_from', 'contradicts')", name="known_kind"
        ),
        ForeignKeyConstraint(
            ["scope_id", "fact_id"],
            ["memory_facts.scope_id", "memory_facts.fact_id"],
            ondelete="CASCADE",
            name="fk_memory_fact_relations_scope_id_fact_id_memory_facts",
        ),
        ForeignKeyConstraint(
            ["scope_id", "target_fact_id"],
            ["memory_facts.scope_id", "memory_facts.fact_id"],
            ondelete="CASCADE",
            name="fk_memory_fact_relations_scope_id_target_fact_id_memory_facts",
        ),
        Index("ix_memory_fact_relations_scope_id_target_fact_id", "scope_id", "target_fact_id"),
    )


class MemoryFactEmbedding(Base):
    """The embedding of one fact's content under one model: at most one per fact.

    ``content_key`` is the fact's key when it was embedded; a vector whose key no longer matches
    (the content was edited) is ignored until re-embedded. ``model`` and ``dimension`` say what
    made it, so a model change is detected and never mixes incomparable vectors.
    """

    __tablename__ = "memory_fact_embeddings"

    fact_row_id: Mapped[int] = mapped_column(
        Id, ForeignKey("memory_facts.id", ondelete="CASCADE"), primary_key=True
    )
    scope_id: Mapped[int] = mapped_column(
        Id, ForeignKey("memory_scopes.id", ondelete="CASCADE"), nullable=False
    )
    model: Mapped[str] = mapped_column(String(255), nullable=False)
    dimension: Mapped[int] = mapped_column(Integer, nullable=False)
    content_key: Mapped[str] = mapped_column(Text, nullable=False)
    vector: Mapped[Any] = mapped_column(Vector, nullable=False)
    embedded_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)

    __table_args__ = (
        CheckConstraint("dimension > 0", name="dimension_positive"),
        Index("ix_memory_fact_embeddings_scope_id_model", "scope_id", "model"),
        Index("ix_memory_fact_embeddings_model", "model"),
    )


class MemoryHistory(Base):
    """Append-only audit trail: one row per changed fact or section per save."""

    __tablename__ = "memory_history"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    scope_id: Mapped[int] = mapped_column(
        Id, ForeignKey("memory_scopes.id", ondelete="CASCADE"), nullable=False
    )
    revision: Mapped[int] = mapped_column(Integer, nullable=False)
    changed_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False, server_default=func.now())
    entity: Mapped[str] = mapped_column(String(16), nullable=False)
    entity_id: Mapped[str] = mapped_column(String(64), nullable=False)
    action: Mapped[str] = mapped_column(String(16), nullable=False)
    origin: Mapped[str] = mapped_column(String(255), nullable=False)
    before: Mapped[dict[str, Any] | None] = mapped_column(Json)
    after: Mapped[dict[str, Any] | None] = mapped_column(Json)
    # Why a fact went when the save did not say so itself: eviction at the cap with its score,
    # a staleness review, a consolidation, an expiry.
    detail: Mapped[dict[str, Any] | None] = mapped_column(Json)
    # The fact's version after the change (``memory_facts.version``); NULL for sections.
    version: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (
        CheckConstraint("entity IN ('fact', 'section')", name="known_entity"),
        CheckConstraint("action IN ('insert', 'update', 'delete')", name="known_action"),
        Index("ix_memory_history_scope_id_revision", "scope_id", "revision"),
        Index("ix_memory_history_changed_at", "changed_at"),
    )


class MemoryScopeSnapshot(Base):
    """Derived, never a source of truth: a scope's document as the save that made ``revision`` wrote it.

    A cold load reads it in place of the rows while ``revision`` equals the scope's; any other
    writer moves the scope's revision without it, and the load reads the rows again until the next
    save. ``document`` holds the JSON of the ``user``, ``history`` and ``facts`` keys; ``layout``
    what the document does not say (the facts' stored positions, the sections that have a row),
    for the next save. Deleting any of these rows loses nothing (docs/schema.md).
    """

    __tablename__ = "memory_scope_snapshots"

    scope_id: Mapped[int] = mapped_column(
        Id, ForeignKey("memory_scopes.id", ondelete="CASCADE"), primary_key=True
    )
    revision: Mapped[int] = mapped_column(Integer, nullable=False)
    document: Mapped[str] = mapped_column(Text, nullable=False)
    layout: Mapped[str] = mapped_column(Text, nullable=False)


class MemoryErasure(Base):
    """One row per erased user, keyed by a SHA-256 digest so the user id itself is gone.

    It lets a save refuse a queued update captured before the erasure (which would otherwise
    bring the user's memory back); ``vacuum`` purges rows older than its horizon.
    """

    __tablename__ = "memory_erasures"

    # SHA-256 of the user id in the default tenant, of ``tenant_id NUL user_id`` in any other.
    user_digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = tenant_column()
    erased_at: Mapped[datetime] = mapped_column(Timestamp, nullable=False)

    __table_args__ = (Index("ix_memory_erasures_erased_at", "erased_at"),)


def _table(model: type[Base]) -> Table:
    return cast(Table, model.__table__)


# The table registry: Core statements use these, so each table is named in one place.
scopes_table = _table(MemoryScope)
sections_table = _table(MemorySection)
facts_table = _table(MemoryFact)
history_table = _table(MemoryHistory)
embeddings_table = _table(MemoryFactEmbedding)
erasures_table = _table(MemoryErasure)
snapshots_table = _table(MemoryScopeSnapshot)
queue_table = _table(MemoryQueueItem)
claims_table = _table(MemoryQueueClaim)
grants_table = _table(MemoryFactGrant)
tags_table = _table(MemoryFactTag)
relations_table = _table(MemoryFactRelation)
sessions_table = _table(MemorySession)
session_turns_table = _table(MemorySessionTurn)
agent_documents_table = _table(MemoryAgentDocument)
agent_document_versions_table = _table(MemoryAgentDocumentVersion)
store_items_table = _table(MemoryStoreItem)
store_item_history_table = _table(MemoryStoreItemHistory)
