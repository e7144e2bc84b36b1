"""tenants, fact visibility and grants, row-level security

Revision ID: 0008
Revises: 0007

Every memory belongs to a tenant. Adds ``tenant_id`` (default ``'default'``, so every existing row
lands in the default tenant and a single-tenant deployment changes nothing) to ``memory_scopes``
(its unique key becomes tenant, user, agent), ``memory_facts``, ``memory_erasures``,
``memory_queue`` (its conversation key gains the tenant) and ``memory_queue_claims`` (the claim
key gains the tenant; claims are leases, not data, so the table is recreated empty and a worker
mid-claim re-claims). Adds ``memory_facts.visibility`` (``private``, ``shared``, ``public``;
existing facts are private) and the new ``memory_fact_grants`` (who a shared fact is granted to).

On PostgreSQL, enables and forces row-level security on every memory table with the policies of
``memstore/storage/sql/schema/rls.py``. Downgrade drops them, the grants and the tenant columns:
it refuses to run while any scope belongs to a tenant other than the default.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from memstore.storage.sql.schema import rls

# The tables this revision puts under row-level security (later revisions add their own).
_RLS_TABLES = (
    "memory_scopes",
    "memory_sections",
    "memory_facts",
    "memory_fact_grants",
    "memory_history",
    "memory_fact_embeddings",
    "memory_erasures",
    "memory_queue",
    "memory_queue_claims",
)

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _tenant() -> sa.Column[str]:
    return sa.Column("tenant_id", sa.String(length=128), server_default=sa.text("'default'"), nullable=False)


def _claims_table(with_tenant: bool) -> None:
    op.create_table(
        "memory_queue_claims",
        *([_tenant()] if with_tenant else []),
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("agent_name", sa.String(length=128), nullable=False),
        sa.Column("lease_owner", sa.String(length=128), nullable=False),
        sa.Column("lease_token", sa.String(length=32), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            *(["tenant_id"] if with_tenant else []), "user_id", "agent_name", name="pk_memory_queue_claims"
        ),
    )


def upgrade() -> None:
    postgresql = op.get_context().dialect.name == "postgresql"
    op.add_column("memory_scopes", _tenant())
    op.drop_index("uq_memory_scopes_scope", table_name="memory_scopes")
    op.create_index(
        "uq_memory_scopes_scope",
        "memory_scopes",
        ["tenant_id", sa.text("coalesce(user_id, '')"), sa.text("coalesce(agent_name, '')")],
        unique=True,
    )
    op.add_column("memory_facts", _tenant())
    if postgresql:
        op.add_column(
            "memory_facts",
            sa.Column("visibility", sa.String(length=8), server_default="private", nullable=False),
        )
        op.create_check_constraint(
            "ck_memory_facts_known_visibility",
            "memory_facts",
            "visibility IN ('private', 'shared', 'public')",
        )
        # The scope's tenant, for facts written before this revision (all 'default' today).
        op.execute(
            "UPDATE memory_facts f SET tenant_id = s.tenant_id FROM memory_scopes s "
            "WHERE s.id = f.scope_id AND f.tenant_id <> s.tenant_id"
        )
    else:
        # SQLite adds a column with its CHECK in place: no table copy of every fact.
        op.execute(
            "ALTER TABLE memory_facts ADD COLUMN visibility VARCHAR(8) DEFAULT 'private' NOT NULL "
            "CONSTRAINT ck_memory_facts_known_visibility "
            "CHECK (visibility IN ('private', 'shared', 'public'))"
        )
    live_shared = "deleted_revision IS NULL AND visibility <> 'private'"
    op.create_index(
        "ix_memory_facts_tenant_id_visibility",
        "memory_facts",
        ["tenant_id", "visibility"],
        sqlite_where=sa.text(live_shared),
        # As pg_get_expr prints it, so alembic check compares it equal (schema/autogen.py).
        postgresql_where=sa.text("deleted_revision IS NULL AND (visibility)::text <> 'private'::text"),
    )
    op.create_index("uq_memory_facts_id_scope_id", "memory_facts", ["id", "scope_id"], unique=True)
    op.create_table(
        "memory_fact_grants",
        sa.Column("fact_row_id", _ID, nullable=False),
        sa.Column("grantee_kind", sa.String(length=4), nullable=False),
        sa.Column("grantee", sa.String(length=128), nullable=False),
        sa.Column("scope_id", _ID, nullable=False),
        _tenant(),
        sa.CheckConstraint(
            "grantee_kind IN ('user', 'role')", name=op.f("ck_memory_fact_grants_known_grantee_kind")
        ),
        sa.ForeignKeyConstraint(
            ["fact_row_id", "scope_id"],
            ["memory_facts.id", "memory_facts.scope_id"],
            name="fk_memory_fact_grants_fact_row_id_scope_id_memory_facts",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["scope_id"],
            ["memory_scopes.id"],
            name="fk_memory_fact_grants_scope_id_memory_scopes",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("fact_row_id", "grantee_kind", "grantee", name="pk_memory_fact_grants"),
    )
    op.create_index(
        "ix_memory_fact_grants_tenant_id_grantee_kind_grantee",
        "memory_fact_grants",
        ["tenant_id", "grantee_kind", "grantee"],
    )
    op.create_index("ix_memory_fact_grants_scope_id", "memory_fact_grants", ["scope_id"])
    op.add_column("memory_erasures", _tenant())
    op.add_column("memory_queue", _tenant())
    op.drop_index("uq_memory_queue_conversation", table_name="memory_queue")
    op.create_index(
        "uq_memory_queue_conversation",
        "memory_queue",
        ["tenant_id", "thread_id", "user_id", "agent_name"],
        unique=True,
    )
    op.drop_index("ix_memory_queue_user_id_agent_name", table_name="memory_queue")
    op.create_index(
        "ix_memory_queue_tenant_id_user_id_agent_name", "memory_queue", ["tenant_id", "user_id", "agent_name"]
    )
    op.drop_table("memory_queue_claims")
    _claims_table(with_tenant=True)
    if postgresql:
        for statement in rls.create_statements(_RLS_TABLES):
            op.execute(statement)


def downgrade() -> None:
    postgresql = op.get_context().dialect.name == "postgresql"
    if not op.get_context().as_sql:
        others = op.get_bind().execute(
            sa.text("SELECT count(*) FROM memory_scopes WHERE tenant_id <> 'default'")
        )
        if others.scalar_one():
            raise RuntimeError(
                "memory_scopes holds tenants other than 'default': erase them first "
                "(memstore erase --tenant ...), since revision 0007 keeps one tenant"
            )
    if postgresql:
        for statement in rls.drop_statements(_RLS_TABLES):
            op.execute(statement)
    op.drop_table("memory_queue_claims")
    _claims_table(with_tenant=False)
    op.drop_index("ix_memory_queue_tenant_id_user_id_agent_name", table_name="memory_queue")
    op.create_index("ix_memory_queue_user_id_agent_name", "memory_queue", ["user_id", "agent_name"])
    op.drop_index("uq_memory_queue_conversation", table_name="memory_queue")
    op.create_index(
        "uq_memory_queue_conversation", "memory_queue", ["thread_id", "user_id", "agent_name"], unique=True
    )
    op.drop_column("memory_queue", "tenant_id")
    op.drop_column("memory_erasures", "tenant_id")
    op.drop_index("ix_memory_fact_grants_scope_id", table_name="memory_fact_grants")
    op.drop_index("ix_memory_fact_grants_tenant_id_grantee_kind_grantee", table_name="memory_fact_grants")
    op.drop_table("memory_fact_grants")
    op.drop_index("ix_memory_facts_tenant_id_visibility", table_name="memory_facts")
    op.drop_index("uq_memory_facts_id_scope_id", table_name="memory_facts")
    if postgresql:
        op.drop_constraint("ck_memory_facts_known_visibility", "memory_facts", type_="check")
    # In place on SQLite (>= 3.35) too: the CHECK is the column's own, so DROP COLUMN allows it.
    op.drop_column("memory_facts", "visibility")
    op.drop_column("memory_facts", "tenant_id")
    op.drop_index("uq_memory_scopes_scope", table_name="memory_scopes")
    op.create_index(
        "uq_memory_scopes_scope",
        "memory_scopes",
        [sa.text("coalesce(user_id, '')"), sa.text("coalesce(agent_name, '')")],
        unique=True,
    )
    op.drop_column("memory_scopes", "tenant_id")
