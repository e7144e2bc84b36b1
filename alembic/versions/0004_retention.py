"""retention signals and removal details

Revision ID: 0004
Revises: 0003

Adds ``last_confirmed_at``, ``last_accessed_at`` and ``access_count`` to ``memory_facts`` (the
signals eviction and decay read) and ``detail`` to ``memory_history`` (why a fact was removed:
eviction at the cap with its score, staleness review, consolidation, expiry). Every new column is
nullable or has a constant default, so neither dialect rewrites the tables.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("memory_facts", sa.Column("last_confirmed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("memory_facts", sa.Column("last_accessed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "memory_facts", sa.Column("access_count", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.add_column(
        "memory_history",
        sa.Column("detail", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True),
    )


def downgrade() -> None:
    # SQLite has dropped columns in place since 3.35 (no table copy).
    op.drop_column("memory_history", "detail")
    op.drop_column("memory_facts", "access_count")
    op.drop_column("memory_facts", "last_accessed_at")
    op.drop_column("memory_facts", "last_confirmed_at")
