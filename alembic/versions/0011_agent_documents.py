"""agent documents: memory_agent_documents and memory_agent_document_versions

Revision ID: 0011
Revises: 0010

The agent's own memory (``memstore/agent_doc.py``): ``memory_agent_documents`` holds one row per
document of ``(tenant_id, agent_name, user_id, path)`` (``user_id`` ``''`` for the agent's own,
shared by its users) with its text and version; a delete keeps the row with ``deleted_at`` set.
``memory_agent_document_versions`` holds each version's text (``NULL`` for a delete), who wrote
it and when. Both are under row-level security on PostgreSQL: the agent's own documents are
its tenant's, a user's documents that user's.

On PostgreSQL every role that already reads ``memory_facts`` (the application role of
``memstore db grant-app-role``) is granted the new tables.

Downgrade drops both tables, documents and history with them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from memstore.storage.sql.schema import rls

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RLS_TABLES = ("memory_agent_documents", "memory_agent_document_versions")
_KEY = ("tenant_id", "agent_name", "user_id", "path")
_DOCUMENT_UPDATES = "content, chars, version, author, actor, updated_at, deleted_at"
_GRANT_READERS = f"""
DO $$
DECLARE reader record;
BEGIN
  FOR reader IN
    SELECT DISTINCT r.rolname FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
    JOIN pg_roles r ON r.oid = a.grantee
    WHERE c.oid = 'memory_facts'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
  LOOP
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON TABLE memory_agent_documents, '
                   'memory_agent_document_versions TO %I', reader.rolname);
    EXECUTE format('GRANT UPDATE ({_DOCUMENT_UPDATES}) ON TABLE memory_agent_documents TO %I',
                   reader.rolname);
  END LOOP;
END $$"""


def _key_columns() -> list[sa.Column[str]]:
    return [
        sa.Column("tenant_id", sa.String(length=128), server_default=sa.text("'default'"), nullable=False),
        sa.Column("agent_name", sa.String(length=128), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("path", sa.String(length=256), nullable=False),
    ]


def _author_check(table: str) -> sa.CheckConstraint:
    return sa.CheckConstraint(
        "author IN ('agent', 'user', 'operator', 'import')", name=op.f(f"ck_{table}_known_author")
    )


def upgrade() -> None:
    op.create_table(
        "memory_agent_documents",
        *_key_columns(),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("chars", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("author", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        _author_check("memory_agent_documents"),
        sa.CheckConstraint("version >= 1", name=op.f("ck_memory_agent_documents_positive_version")),
        sa.PrimaryKeyConstraint(*_KEY, name="pk_memory_agent_documents"),
    )
    op.create_index(
        "ix_memory_agent_documents_tenant_id_user_id", "memory_agent_documents", ["tenant_id", "user_id"]
    )
    op.create_table(
        "memory_agent_document_versions",
        *_key_columns(),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("action", sa.String(length=8), nullable=False),
        sa.Column("author", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=True),
        sa.Column("content", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "action IN ('write', 'edit', 'delete')",
            name=op.f("ck_memory_agent_document_versions_known_action"),
        ),
        _author_check("memory_agent_document_versions"),
        sa.PrimaryKeyConstraint(*_KEY, "version", name="pk_memory_agent_document_versions"),
    )
    op.create_index(
        "ix_memory_agent_document_versions_tenant_id_actor",
        "memory_agent_document_versions",
        ["tenant_id", "actor"],
    )
    if op.get_context().dialect.name == "postgresql":
        for statement in rls.create_statements(_RLS_TABLES):
            op.execute(statement)
        op.execute(_GRANT_READERS)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for statement in rls.drop_statements(_RLS_TABLES):
            op.execute(statement)
    op.drop_index(
        "ix_memory_agent_document_versions_tenant_id_actor", table_name="memory_agent_document_versions"
    )
    op.drop_table("memory_agent_document_versions")
    op.drop_index("ix_memory_agent_documents_tenant_id_user_id", table_name="memory_agent_documents")
    op.drop_table("memory_agent_documents")
