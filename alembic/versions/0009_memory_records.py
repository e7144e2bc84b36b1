"""memory records: type, importance, tags, source kind, raw and structured content, versions, relations

Revision ID: 0009
Revises: 0008

The memory-layer design's record, beside DeerFlow's fact (``memstore/record.py``). Adds to
``memory_facts``: ``memory_type`` (existing facts take their category's type: preference ->
preference, knowledge -> semantic, context -> episodic, behavior -> procedural, goal -> profile,
any other -> semantic), ``importance`` (0.5), ``source_kind`` (``implicit_inference``), ``raw`` and
``structured`` (NULL) and ``version`` (1). Adds ``memory_history.version`` (NULL for rows written
before) and two tables: ``memory_fact_tags`` and ``memory_fact_relations``, both under row-level
security on PostgreSQL.

On PostgreSQL, the data statements run with ``memory_facts``' row-level security unforced, so a
table owner that the policies bind still migrates every row, and every role that already reads
``memory_facts`` (the application role of ``memstore db grant-app-role``) is granted the new tables
and columns, so an upgraded deployment keeps working without running that command again.

Downgrade drops them; it refuses to run while any fact holds a value other than those defaults, a
tag or a relation, since the older schema has nowhere to keep it (on PostgreSQL the check is in
the script itself, so the rendered SQL refuses too).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from memstore.storage.sql.schema import rls

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_RLS_TABLES = ("memory_fact_tags", "memory_fact_relations")
_NEW_FACT_COLUMNS = "memory_type, importance, source_kind, raw, structured, version"
# Every role (but the owner and PUBLIC) that may read memory_facts gets the new tables and columns.
_GRANT_READERS = f"""
DO $$
DECLARE reader record;
BEGIN
  FOR reader IN
    SELECT DISTINCT r.rolname FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
    JOIN pg_roles r ON r.oid = a.grantee
    WHERE c.oid = 'memory_facts'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
  LOOP
    EXECUTE format('GRANT SELECT, INSERT, DELETE ON TABLE memory_fact_tags, memory_fact_relations TO %I',
                   reader.rolname);
    EXECUTE format('GRANT UPDATE ({_NEW_FACT_COLUMNS}) ON TABLE memory_facts TO %I', reader.rolname);
  END LOOP;
END $$"""
_TYPE_OF_CATEGORY = (
    "CASE category WHEN 'preference' THEN 'preference' WHEN 'knowledge' THEN 'semantic' "
    "WHEN 'context' THEN 'episodic' WHEN 'behavior' THEN 'procedural' WHEN 'goal' THEN 'profile' "
    "ELSE 'semantic' END"
)
# Rows the older schema has nowhere to keep: downgrading refuses while there are any.
_KEPT = (
    "(SELECT count(*) FROM memory_fact_tags) + (SELECT count(*) FROM memory_fact_relations) "
    "+ (SELECT count(*) FROM memory_facts WHERE importance <> 0.5 OR source_kind <> 'implicit_inference' "
    f"OR raw IS NOT NULL OR structured IS NOT NULL OR memory_type <> {_TYPE_OF_CATEGORY})"
)
_REFUSAL = (
    "memory facts hold record fields (a type, importance, tags, source kind, raw or structured "
    "content, relations) that revision 0008 cannot keep: export them first"
)
# Each new column with its CHECK, added in place on both dialects (no table copy of every fact).
_FACT_COLUMNS = (
    "memory_type VARCHAR(16) DEFAULT 'semantic' NOT NULL CONSTRAINT ck_memory_facts_known_memory_type "
    "CHECK (memory_type IN ('episodic', 'semantic', 'procedural', 'preference', 'profile'))",
    "importance FLOAT DEFAULT 0.5 NOT NULL CONSTRAINT ck_memory_facts_importance_range "
    "CHECK (importance >= 0 AND importance <= 1)",
    "source_kind VARCHAR(24) DEFAULT 'implicit_inference' NOT NULL "
    "CONSTRAINT ck_memory_facts_known_source_kind CHECK (source_kind IN ('explicit_user_input', "
    "'implicit_inference', 'system_generated', 'external_data', 'corrected_memory'))",
    "raw TEXT",
    # JSON, not JSONB: JSONB rewrites numbers (1e16 becomes an integer, -0.0 becomes 0).
    "structured JSON",
    "version INTEGER DEFAULT 1 NOT NULL CONSTRAINT ck_memory_facts_version_positive CHECK (version >= 1)",
)


def _tenant() -> sa.Column[str]:
    return sa.Column("tenant_id", sa.String(length=128), server_default=sa.text("'default'"), nullable=False)


def upgrade() -> None:
    postgresql = op.get_context().dialect.name == "postgresql"
    for column in _FACT_COLUMNS:
        op.execute(f"ALTER TABLE memory_facts ADD COLUMN {column}")
    if postgresql:  # the owner may be bound by the policies: it must see every row to migrate it
        op.execute("ALTER TABLE memory_facts NO FORCE ROW LEVEL SECURITY")
    op.execute(
        f"UPDATE memory_facts SET memory_type = {_TYPE_OF_CATEGORY} WHERE memory_type <> {_TYPE_OF_CATEGORY}"
    )
    if postgresql:
        op.execute("ALTER TABLE memory_facts FORCE ROW LEVEL SECURITY")
    op.add_column("memory_history", sa.Column("version", sa.Integer(), nullable=True))
    op.create_table(
        "memory_fact_tags",
        sa.Column("fact_row_id", _ID, nullable=False),
        sa.Column("tag", sa.String(length=64), nullable=False),
        sa.Column("scope_id", _ID, nullable=False),
        _tenant(),
        sa.ForeignKeyConstraint(
            ["fact_row_id", "scope_id"],
            ["memory_facts.id", "memory_facts.scope_id"],
            name="fk_memory_fact_tags_fact_row_id_scope_id_memory_facts",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["scope_id"],
            ["memory_scopes.id"],
            name="fk_memory_fact_tags_scope_id_memory_scopes",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("fact_row_id", "tag", name="pk_memory_fact_tags"),
    )
    op.create_index("ix_memory_fact_tags_tenant_id_tag", "memory_fact_tags", ["tenant_id", "tag"])
    op.create_index("ix_memory_fact_tags_scope_id", "memory_fact_tags", ["scope_id"])
    op.create_table(
        "memory_fact_relations",
        sa.Column("scope_id", _ID, nullable=False),
        sa.Column("fact_id", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("target_fact_id", sa.String(length=64), nullable=False),
        _tenant(),
        sa.CheckConstraint(
            "kind IN ('related_to', 'supersedes', 'derived_from', 'contradicts')",
            name=op.f("ck_memory_fact_relations_known_kind"),
        ),
        sa.ForeignKeyConstraint(
            ["scope_id", "fact_id"],
            ["memory_facts.scope_id", "memory_facts.fact_id"],
            name="fk_memory_fact_relations_scope_id_fact_id_memory_facts",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["scope_id", "target_fact_id"],
            ["memory_facts.scope_id", "memory_facts.fact_id"],
            name="fk_memory_fact_relations_scope_id_target_fact_id_memory_facts",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["scope_id"],
            ["memory_scopes.id"],
            name="fk_memory_fact_relations_scope_id_memory_scopes",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "scope_id", "fact_id", "kind", "target_fact_id", name="pk_memory_fact_relations"
        ),
    )
    op.create_index(
        "ix_memory_fact_relations_scope_id_target_fact_id",
        "memory_fact_relations",
        ["scope_id", "target_fact_id"],
    )
    if postgresql:
        for statement in rls.create_statements(_RLS_TABLES):
            op.execute(statement)
        op.execute(_GRANT_READERS)


def downgrade() -> None:
    postgresql = op.get_context().dialect.name == "postgresql"
    if postgresql:
        # Unforced, so the check counts every row even for an owner the policies bind.
        for table in ("memory_facts", *_RLS_TABLES):
            op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
        op.execute(f"DO $$ BEGIN IF ({_KEPT}) > 0 THEN RAISE EXCEPTION '{_REFUSAL}'; END IF; END $$")
        op.execute("ALTER TABLE memory_facts FORCE ROW LEVEL SECURITY")
    elif not op.get_context().as_sql and op.get_bind().execute(sa.text(f"SELECT {_KEPT}")).scalar_one():
        raise RuntimeError(_REFUSAL)
    if postgresql:
        for statement in rls.drop_statements(_RLS_TABLES):
            op.execute(statement)
    op.drop_index("ix_memory_fact_relations_scope_id_target_fact_id", table_name="memory_fact_relations")
    op.drop_table("memory_fact_relations")
    op.drop_index("ix_memory_fact_tags_scope_id", table_name="memory_fact_tags")
    op.drop_index("ix_memory_fact_tags_tenant_id_tag", table_name="memory_fact_tags")
    op.drop_table("memory_fact_tags")
    op.drop_column("memory_history", "version")
    for name in ("version", "structured", "raw", "source_kind", "importance", "memory_type"):
        if postgresql:  # SQLite drops a column's own CHECK with it
            constraint = {
                "version": "version_positive",
                "source_kind": "known_source_kind",
                "importance": "importance_range",
                "memory_type": "known_memory_type",
            }.get(name)
            if constraint is not None:
                op.drop_constraint(op.f(f"ck_memory_facts_{constraint}"), "memory_facts", type_="check")
        op.drop_column("memory_facts", name)
