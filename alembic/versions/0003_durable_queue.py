"""durable update queue

Revision ID: 0003
Revises: 0002

Adds ``memory_queue`` (one row per pending conversation, keyed by thread, user and agent, with
its lease, attempts, last error and state) and ``memory_queue_claims`` (at most one row per
scope: the primary key is what keeps two workers off the same scope). Both are new tables, so
the revision needs no table copy on SQLite and no lock on the memory tables on PostgreSQL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "memory_queue",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("thread_id", sa.String(length=255), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("agent_name", sa.String(length=128), nullable=False),
        sa.Column("messages", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.Column("correction_detected", sa.Boolean(), nullable=False),
        sa.Column("reinforcement_detected", sa.Boolean(), nullable=False),
        sa.Column("state", sa.String(length=8), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("failures", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("captured_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pending_since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("latest_due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("lease_token", sa.String(length=32), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("enqueued_by", sa.String(length=128), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('pending', 'leased', 'done', 'dead')", name=op.f("ck_memory_queue_known_state")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memory_queue")),
    )
    op.create_index(
        "uq_memory_queue_conversation", "memory_queue", ["thread_id", "user_id", "agent_name"], unique=True
    )
    op.create_index(op.f("ix_memory_queue_state_due_at"), "memory_queue", ["state", "due_at"], unique=False)
    op.create_index(
        op.f("ix_memory_queue_user_id_agent_name"), "memory_queue", ["user_id", "agent_name"], unique=False
    )
    op.create_table(
        "memory_queue_claims",
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("agent_name", sa.String(length=128), nullable=False),
        sa.Column("lease_owner", sa.String(length=128), nullable=False),
        sa.Column("lease_token", sa.String(length=32), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("user_id", "agent_name", name=op.f("pk_memory_queue_claims")),
    )


def downgrade() -> None:
    op.drop_table("memory_queue_claims")
    op.drop_index(op.f("ix_memory_queue_user_id_agent_name"), table_name="memory_queue")
    op.drop_index(op.f("ix_memory_queue_state_due_at"), table_name="memory_queue")
    op.drop_index("uq_memory_queue_conversation", table_name="memory_queue")
    op.drop_table("memory_queue")
