"""session memory: memory_sessions, memory_session_turns, and the queue's job kinds

Revision ID: 0010
Revises: 0009

Short-term memory (``memstore/session.py``): ``memory_sessions`` holds one row per session of
``(tenant_id, user_id, agent_name, session_id)`` with its turn numbering, the raw turns and tokens
waiting for compression and when it expires; ``memory_session_turns`` holds its turns in order
(a compressed summary is one ``system`` turn with ``is_summary``). Both are under row-level
security on PostgreSQL: a session is its user's alone.

``memory_queue`` gains ``kind``: ``conversation`` (every existing row) or ``session_compress`` (a
session due for compression); the conversation key gains it, so a session job never coalesces
with a conversation of the same id.

On PostgreSQL every role that already reads ``memory_facts`` (the application role of
``memstore db grant-app-role``) is granted the new tables, so an upgraded deployment keeps working
without running that command again.

Downgrade drops both tables (sessions are short-term memory: their turns are gone with them) and
the queue's session rows, then ``kind``.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from memstore.storage.sql.schema import rls

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RLS_TABLES = ("memory_sessions", "memory_session_turns")
_KEY = ("tenant_id", "user_id", "agent_name", "session_id")
_SESSION_UPDATES = "next_seq, turn_count, token_count, summary_seq, compressions, updated_at, expires_at"
_GRANT_READERS = f"""
DO $$
DECLARE reader record;
BEGIN
  FOR reader IN
    SELECT DISTINCT r.rolname FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
    JOIN pg_roles r ON r.oid = a.grantee
    WHERE c.oid = 'memory_facts'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
  LOOP
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON TABLE memory_sessions, memory_session_turns TO %I',
                   reader.rolname);
    EXECUTE format('GRANT UPDATE ({_SESSION_UPDATES}) ON TABLE memory_sessions TO %I', reader.rolname);
  END LOOP;
END $$"""
_QUEUE_KEY = ("tenant_id", "thread_id", "user_id", "agent_name")


def _key_columns() -> list[sa.Column[str]]:
    return [
        sa.Column("tenant_id", sa.String(length=128), server_default=sa.text("'default'"), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("agent_name", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=False),
    ]


def upgrade() -> None:
    postgresql = op.get_context().dialect.name == "postgresql"
    op.create_table(
        "memory_sessions",
        *_key_columns(),
        sa.Column("epoch", sa.String(length=16), nullable=False),
        sa.Column("next_seq", sa.BigInteger(), nullable=False),
        sa.Column("turn_count", sa.Integer(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("summary_seq", sa.BigInteger(), nullable=True),
        sa.Column("compressions", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(*_KEY, name="pk_memory_sessions"),
    )
    op.create_index(
        "ix_memory_sessions_tenant_id_user_id_updated_at",
        "memory_sessions",
        ["tenant_id", "user_id", "updated_at"],
    )
    op.create_index("ix_memory_sessions_expires_at", "memory_sessions", ["expires_at"])
    op.create_table(
        "memory_session_turns",
        *_key_columns(),
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=True),
        sa.Column("tool_calls", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("is_summary", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "role IN ('user', 'assistant', 'system', 'tool')", name=op.f("ck_memory_session_turns_known_role")
        ),
        sa.ForeignKeyConstraint(
            list(_KEY),
            [f"memory_sessions.{column}" for column in _KEY],
            name="fk_memory_session_turns_tenant_id_memory_sessions",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(*_KEY, "seq", name="pk_memory_session_turns"),
    )
    op.execute(
        "ALTER TABLE memory_queue ADD COLUMN kind VARCHAR(16) DEFAULT 'conversation' NOT NULL "
        "CONSTRAINT ck_memory_queue_known_kind "
        "CHECK (kind IN ('conversation', 'session_compress'))"
    )
    op.drop_index("uq_memory_queue_conversation", table_name="memory_queue")
    op.create_index(
        "uq_memory_queue_conversation",
        "memory_queue",
        ["tenant_id", "kind", "thread_id", "user_id", "agent_name"],
        unique=True,
    )
    if postgresql:
        for statement in rls.create_statements(_RLS_TABLES):
            op.execute(statement)
        op.execute(_GRANT_READERS)


def downgrade() -> None:
    postgresql = op.get_context().dialect.name == "postgresql"
    if postgresql:
        for statement in rls.drop_statements(_RLS_TABLES):
            op.execute(statement)
        op.execute("ALTER TABLE memory_queue NO FORCE ROW LEVEL SECURITY")
    op.execute("DELETE FROM memory_queue WHERE kind <> 'conversation'")
    if postgresql:
        op.execute("ALTER TABLE memory_queue FORCE ROW LEVEL SECURITY")
    op.drop_index("uq_memory_queue_conversation", table_name="memory_queue")
    op.create_index("uq_memory_queue_conversation", "memory_queue", list(_QUEUE_KEY), unique=True)
    if postgresql:  # SQLite drops a column's own CHECK with it
        op.drop_constraint(op.f("ck_memory_queue_known_kind"), "memory_queue", type_="check")
    op.drop_column("memory_queue", "kind")
    op.drop_table("memory_session_turns")
    op.drop_index("ix_memory_sessions_expires_at", table_name="memory_sessions")
    op.drop_index("ix_memory_sessions_tenant_id_user_id_updated_at", table_name="memory_sessions")
    op.drop_table("memory_sessions")
