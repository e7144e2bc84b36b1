"""store items: memory_store_items and memory_store_item_history

Revision ID: 0012
Revises: 0011

The LangGraph store (``memstore.integrations.langgraph_store.MemstoreStore``):
``memory_store_items`` holds one row per item of ``(tenant_id, user_id, agent_name, namespace,
key)`` (``agent_name`` ``''`` when the store names no agent; ``namespace`` the labels joined by
``.``) with its JSON value, the text a query ranks it by and its vector; a delete keeps the row
with ``deleted_at`` set and no value. ``memory_store_item_history`` holds each put (with its
value) and delete, the newest 20 per item. ``namespace`` and ``key`` compare by code point
(``COLLATE "C"`` on PostgreSQL), so the primary key serves namespace-prefix scans as ranges. Both
tables are under row-level security on PostgreSQL: a user's items are that user's alone.

On PostgreSQL every role that already reads ``memory_facts`` (the application role of
``memstore db grant-app-role``) is granted the new tables.

Downgrade drops both tables, items and history with them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from memstore.storage.sql.schema import rls

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RLS_TABLES = ("memory_store_items", "memory_store_item_history")
_KEY = ("tenant_id", "user_id", "agent_name", "namespace", "key")
_ITEM_UPDATES = (
    "value, indexed_text, model, dimension, embedding, version, created_at, updated_at, deleted_at"
)
_GRANT_READERS = f"""
DO $$
DECLARE reader record;
BEGIN
  FOR reader IN
    SELECT DISTINCT r.rolname FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
    JOIN pg_roles r ON r.oid = a.grantee
    WHERE c.oid = 'memory_facts'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
  LOOP
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON TABLE memory_store_items, '
                   'memory_store_item_history TO %I', reader.rolname);
    EXECUTE format('GRANT UPDATE ({_ITEM_UPDATES}) ON TABLE memory_store_items TO %I', reader.rolname);
  END LOOP;
END $$"""


def _key_columns() -> list[sa.Column[str]]:
    return [
        sa.Column("tenant_id", sa.String(length=128), server_default=sa.text("'default'"), nullable=False),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("agent_name", sa.String(length=128), nullable=False),
        sa.Column(
            "namespace",
            sa.Text().with_variant(postgresql.TEXT(collation="C"), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "key",
            sa.String(length=512).with_variant(postgresql.VARCHAR(length=512, collation="C"), "postgresql"),
            nullable=False,
        ),
    ]


def upgrade() -> None:
    op.create_table(
        "memory_store_items",
        *_key_columns(),
        sa.Column("value", sa.Text(), nullable=True),
        sa.Column("indexed_text", sa.Text(), nullable=True),
        sa.Column("model", sa.String(length=255), nullable=True),
        sa.Column("dimension", sa.Integer(), nullable=True),
        sa.Column(
            "embedding",
            sa.LargeBinary().with_variant(postgresql.ARRAY(postgresql.REAL()), "postgresql"),
            nullable=True,
        ),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("version >= 1", name=op.f("ck_memory_store_items_positive_version")),
        sa.CheckConstraint(
            "(deleted_at IS NULL) = (value IS NOT NULL)", name=op.f("ck_memory_store_items_value_while_live")
        ),
        sa.CheckConstraint(
            "(embedding IS NULL) = (dimension IS NULL) AND (embedding IS NULL) = (model IS NULL)",
            name=op.f("ck_memory_store_items_vector_described"),
        ),
        sa.PrimaryKeyConstraint(*_KEY, name="pk_memory_store_items"),
    )
    op.create_index(
        "ix_memory_store_items_tenant_id_user_id_agent_name_updated_at",
        "memory_store_items",
        ["tenant_id", "user_id", "agent_name", "updated_at"],
    )
    op.create_table(
        "memory_store_item_history",
        *_key_columns(),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("op", sa.String(length=8), nullable=False),
        sa.Column("value", sa.Text(), nullable=True),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("op IN ('put', 'delete')", name=op.f("ck_memory_store_item_history_known_op")),
        sa.CheckConstraint(
            "(op = 'put') = (value IS NOT NULL)", name=op.f("ck_memory_store_item_history_value_of_put")
        ),
        sa.PrimaryKeyConstraint(*_KEY, "version", name="pk_memory_store_item_history"),
    )
    if op.get_context().dialect.name == "postgresql":
        for statement in rls.create_statements(_RLS_TABLES):
            op.execute(statement)
        op.execute(_GRANT_READERS)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        for statement in rls.drop_statements(_RLS_TABLES):
            op.execute(statement)
    op.drop_table("memory_store_item_history")
    op.drop_index(
        "ix_memory_store_items_tenant_id_user_id_agent_name_updated_at", table_name="memory_store_items"
    )
    op.drop_table("memory_store_items")
