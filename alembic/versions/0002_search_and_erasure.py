"""full-text search, erasure records and the vacuum horizon

Revision ID: 0002
Revises: 0001

Adds the full-text index on fact content (FTS5 on SQLite, a GIN ``tsvector`` expression index
on PostgreSQL; DDL in ``memstore/storage/sql/schema/fts_schema.py``), ``memory_scopes.cleared_at`` and
``purged_revision``, and the ``memory_erasures`` table that keeps late queued updates from
bringing an erased user back. Adding columns needs no table copy on SQLite.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from memstore.storage.sql.schema import fts_schema

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("memory_scopes", sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "memory_scopes",
        sa.Column("purged_revision", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.create_table(
        "memory_erasures",
        sa.Column("user_digest", sa.String(length=64), nullable=False),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("user_digest", name=op.f("pk_memory_erasures")),
    )
    op.create_index(op.f("ix_memory_erasures_erased_at"), "memory_erasures", ["erased_at"], unique=False)
    for statement in _fts_ddl(create=True):
        op.execute(statement)


def downgrade() -> None:
    for statement in _fts_ddl(create=False):
        op.execute(statement)
    op.drop_index(op.f("ix_memory_erasures_erased_at"), table_name="memory_erasures")
    op.drop_table("memory_erasures")
    # Plain DROP COLUMN (SQLite >= 3.35): a batch copy of memory_scopes would cascade-delete
    # every child row when the old table is dropped with foreign keys on.
    op.drop_column("memory_scopes", "purged_revision")
    op.drop_column("memory_scopes", "cleared_at")


def _fts_ddl(*, create: bool) -> Sequence[str]:
    if op.get_context().dialect.name == "sqlite":
        return fts_schema.SQLITE_CREATE if create else fts_schema.SQLITE_DROP
    return fts_schema.POSTGRESQL_CREATE if create else fts_schema.POSTGRESQL_DROP
