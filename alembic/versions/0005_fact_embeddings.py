"""fact embeddings

Revision ID: 0005
Revises: 0004

Adds ``memory_fact_embeddings``: one vector per fact, with the model and dimension that made it
and the content key it was made from. The vector is float32 bytes on SQLite (``sqlite-vec``
reads them directly) and ``real[]`` on PostgreSQL (``pgvector`` casts it to ``vector`` when the
extension is installed; nothing here requires it). Deleting a fact or a scope deletes its vectors.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "memory_fact_embeddings",
        sa.Column("fact_row_id", _ID, nullable=False),
        sa.Column("scope_id", _ID, nullable=False),
        sa.Column("model", sa.String(length=255), nullable=False),
        sa.Column("dimension", sa.Integer(), nullable=False),
        sa.Column("content_key", sa.Text(), nullable=False),
        sa.Column(
            "vector",
            sa.LargeBinary().with_variant(postgresql.ARRAY(postgresql.REAL()), "postgresql"),
            nullable=False,
        ),
        sa.Column("embedded_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("dimension > 0", name=op.f("ck_memory_fact_embeddings_dimension_positive")),
        sa.ForeignKeyConstraint(
            ["fact_row_id"],
            ["memory_facts.id"],
            name=op.f("fk_memory_fact_embeddings_fact_row_id_memory_facts"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["scope_id"],
            ["memory_scopes.id"],
            name=op.f("fk_memory_fact_embeddings_scope_id_memory_scopes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("fact_row_id", name=op.f("pk_memory_fact_embeddings")),
    )
    op.create_index(
        "ix_memory_fact_embeddings_scope_id_model", "memory_fact_embeddings", ["scope_id", "model"]
    )
    op.create_index("ix_memory_fact_embeddings_model", "memory_fact_embeddings", ["model"])


def downgrade() -> None:
    op.drop_index("ix_memory_fact_embeddings_model", table_name="memory_fact_embeddings")
    op.drop_index("ix_memory_fact_embeddings_scope_id_model", table_name="memory_fact_embeddings")
    op.drop_table("memory_fact_embeddings")
