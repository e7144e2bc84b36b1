"""scope snapshots: memory_scope_snapshots, each scope's document as its latest save wrote it

Revision ID: 0013
Revises: 0012

``memory_scope_snapshots`` is derived data (docs/schema.md): one row per scope holding the JSON of
its document (``user``, ``history``, ``facts``) at ``revision``, written by each save in its own
transaction, so a cold load reads one row instead of building the document from every fact row.
A load uses it only while its ``revision`` equals the scope's, so a writer that does not maintain
it (this revision's predecessors, a DBA's ``UPDATE``) only costs loads their speed, never their
exactness. It starts empty: each scope's next save fills it in. On PostgreSQL it is under
row-level security (its scope's owner only, like ``memory_sections``), and every role that holds
a privilege on ``memory_facts`` (the application role of ``memstore db grant-app-role``) is given
the same one on it, each separately: a role that only reads facts only reads snapshots, and ``UPDATE``
on any of the facts' columns gives ``UPDATE`` on the snapshot's.

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
_GRANT_AS_FACTS = f"""
DO $$
DECLARE held record;
BEGIN
  FOR held IN
    SELECT r.rolname, a.privilege_type FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
    JOIN pg_roles r ON r.oid = a.grantee
    WHERE c.oid = 'memory_facts'::regclass AND a.grantee <> c.relowner
      AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
    UNION
    SELECT r.rolname, a.privilege_type FROM pg_attribute t CROSS JOIN LATERAL aclexplode(t.attacl) a
    JOIN pg_roles r ON r.oid = a.grantee JOIN pg_class c ON c.oid = t.attrelid
    WHERE t.attrelid = 'memory_facts'::regclass AND a.grantee <> c.relowner AND a.privilege_type = 'UPDATE'
  LOOP
    IF held.privilege_type = 'UPDATE' THEN
      EXECUTE format('GRANT UPDATE (revision, document, layout) ON TABLE {_TABLE} TO %I', held.rolname);
    ELSE
      EXECUTE format('GRANT %s ON TABLE {_TABLE} TO %I', held.privilege_type, held.rolname);
    END IF;
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
        op.execute(_GRANT_AS_FACTS)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for statement in rls.drop_statements((_TABLE,)):
            op.execute(statement)
    op.drop_table(_TABLE)
