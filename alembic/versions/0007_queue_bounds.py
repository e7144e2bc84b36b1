"""queue bounds in the table

Revision ID: 0007
Revises: 0006

Adds ``memory_queue.message_chars``, the characters of a queued conversation's text, so each
enqueue can check ``max_queue_chars`` and a user's share of it with one indexed read instead of
measuring every stored conversation. Rows queued before this revision that still hold messages
(pending, leased, dead) are measured here as the code measures them: each message's text plus 24
characters; done rows hold none and get 0, as does a row whose messages are not a JSON list.
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
    # What the queue's code computes (queue_table.stored_message_chars): each message's text plus 24.
    if op.get_context().dialect.name == "postgresql":
        measured = (
            "(SELECT coalesce(sum(length(m->>'content')) + 24 * count(*), 0) "
            "FROM jsonb_array_elements(messages) AS m) WHERE jsonb_typeof(messages) = 'array'"
        )
    else:
        measured = (
            "(SELECT coalesce(sum(CASE WHEN type = 'object' THEN length(json_extract(value, '$.content')) "
            "ELSE 0 END) + 24 * count(*), 0) FROM json_each(messages)) "
            "WHERE json_valid(messages) AND json_type(messages) = 'array'"
        )
    op.execute(
        f"UPDATE memory_queue SET message_chars = {measured} AND state IN ('pending', 'leased', 'dead')"
    )


def downgrade() -> None:
    # SQLite has dropped columns in place since 3.35: no table copy.
    op.drop_column("memory_queue", "message_chars")
