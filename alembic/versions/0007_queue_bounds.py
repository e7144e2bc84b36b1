"""queue bounds in the table

Revision ID: 0007
Revises: 0006

Adds ``memory_queue.message_chars``, the characters of a queued conversation's text, so each
enqueue can check ``max_queue_chars`` and a user's share of it with one indexed read instead of
measuring every stored conversation. Rows queued before this revision are measured once, by the
length of their stored JSON (a slight overcount: it includes the keys); done rows hold no
messages and get 0.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "memory_queue",
        sa.Column("message_chars", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    as_text = "messages::text" if op.get_context().dialect.name == "postgresql" else "messages"
    op.execute(
        f"UPDATE memory_queue SET message_chars = length({as_text}) WHERE state IN ('pending', 'leased')"
    )


def downgrade() -> None:
    # SQLite has dropped columns in place since 3.35: no table copy.
    op.drop_column("memory_queue", "message_chars")
