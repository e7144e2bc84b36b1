"""scope snapshots: memory_scope_snapshots, each scope's document as its latest save wrote it

Revision ID: 0013
Revises: 0012

``memory_scope_snapshots`` is derived data (docs/schema.md): one row per scope holding the JSON of
its document (``user``, ``history``, ``facts``) at ``revision``, written by each save in its own
transaction, so a cold load reads one row instead of building the document from every fact row.
A load uses it only while its ``revision`` equals the scope's, so a writer that does not maintain
it (this revision's predecessors, a DBA's ``UPDATE``) only costs loads their speed, never their
exactness. It starts empty: each scope's next save fills it in. On PostgreSQL it is under
row-level security (its scope's owner only, like ``memory_sections``), and every role that
already reads ``memory_facts`` (the application role of ``memstore db grant-app-role``) is granted
it.

Downgrade drops the table; nothing else refers to it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from memstore.storage.sql.schema import rls

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "memory_scope_snapshots"
_GRANT_READERS = f"""
DO $$
DECLARE reader record;
BEGIN
  FOR reader IN
    SELECT DISTINCT r.rolname FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
    JOIN pg_roles r ON r.oid = a.grantee
    WHERE c.oid = 'memory_facts'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
  LOOP
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON TABLE {_TABLE} TO %I', reader.rolname);
    EXECUTE format('GRANT UPDATE (revision, document, layout) ON TABLE {_TABLE} TO %I', reader.rolname);
  END LOOP;
END $$"""


def upgrade() -> None:
    op.create_table(
        _TABLE,
        sa.Column("scope_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("layout", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["scope_id"],
            ["memory_scopes.id"],
            name=op.f("fk_memory_scope_snapshots_scope_id_memory_scopes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("scope_id", name=op.f("pk_memory_scope_snapshots")),
    )
    if op.get_context().dialect.name == "postgresql":
        for statement in rls.create_statements((_TABLE,)):
            op.execute(statement)
        op.execute(_GRANT_READERS)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for statement in rls.drop_statements((_TABLE,)):
            op.execute(statement)
    op.drop_table(_TABLE)
