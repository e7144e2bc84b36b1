"""The PostgreSQL role the application connects as: subject to row-level security (``rls.py``).

Row-level security binds only a role that neither is a superuser, nor has ``BYPASSRLS``; ``FORCE``
(revision 0008) binds the tables' owner too, but an owner may turn it off again, so the
application's role owns nothing. It may read and write the rows of the memory tables and use
their id sequences, and read ``alembic_version`` (the storage checks the schema is at head when
it opens): no DDL, no other table. Cross-tenant work (migrations, the worker's claims, stats,
erase, vacuum, backup) runs on ``operator_database_url`` instead.

The statements are rendered here once, so ``memstore db grant-app-role --print`` shows a DBA
exactly what the command runs. A password never appears in them: the command sends libpq's
encrypted verifier (as ``psql``'s ``\\password`` does), so neither argv nor the server's statement
log sees the cleartext.
"""

from __future__ import annotations

import re

from sqlalchemy import Connection, Engine, text

from memstore.errors import ConfigError
from memstore.storage.sql.schema.models import Base

ROLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
VERSION_TABLE = "alembic_version"
_ROLE_FLAGS = "LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEROLE NOCREATEDB"
_ROLE_STATE = text("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = :role")
_OWNED = text(
    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = :schema AND c.relname = ANY(:tables) AND pg_get_userbyid(c.relowner) = :role"
)


def memory_tables() -> list[str]:
    """Every memory table memstore's models define (what the policies must cover)."""
    return sorted(Base.metadata.tables)


def sequences() -> list[str]:
    """The id sequences of the memory tables (``BIGSERIAL`` names them ``<table>_<column>_seq``)."""
    return sorted(
        f"{table.name}_{table.autoincrement_column.name}_seq"
        for table in Base.metadata.tables.values()
        if table.autoincrement_column is not None
    )


def check_role_name(role: str) -> str:
    if not ROLE_NAME.fullmatch(role):
        raise ConfigError(f"role name {role!r}: use 1-63 letters, digits and _ (not starting with a digit)")
    return role


def create_statement(role: str) -> str:
    """``CREATE ROLE``: a login that row-level security binds, unable to create roles or databases."""
    return f'CREATE ROLE "{check_role_name(role)}" {_ROLE_FLAGS}'


UPDATABLE: dict[str, tuple[str, ...]] = {
    "memory_scopes": ("revision", "version", "updated_at", "cleared_at", "purged_revision"),
    "memory_sections": ("summary", "updated_at", "extra", "revision"),
    "memory_scope_snapshots": ("revision", "document", "layout"),
    "memory_facts": (
        "position",
        "content",
        "content_key",
        "category",
        "confidence",
        "created_at",
        "source",
        "source_error",
        "extra",
        "visibility",
        "added_revision",
        "updated_revision",
        "deleted_revision",
        "deleted_at",
        "last_confirmed_at",
        "last_accessed_at",
        "access_count",
        "memory_type",
        "importance",
        "source_kind",
        "raw",
        "structured",
        "version",
    ),
    "memory_history": ("detail",),
    "memory_fact_embeddings": ("model", "dimension", "content_key", "vector", "embedded_at"),
    "memory_queue": (
        "messages",
        "message_chars",
        "correction_detected",
        "reinforcement_detected",
        "state",
        "generation",
        "attempts",
        "failures",
        "captured_at",
        "pending_since",
        "due_at",
        "latest_due_at",
        "not_before",
        "lease_owner",
        "lease_token",
        "lease_expires_at",
        "enqueued_by",
        "last_error",
        "updated_at",
        "completed_at",
    ),
    "memory_queue_claims": ("lease_owner", "lease_token", "lease_expires_at", "claimed_at"),
    "memory_sessions": (
        "next_seq",
        "turn_count",
        "token_count",
        "summary_seq",
        "compressions",
        "updated_at",
        "expires_at",
    ),
    "memory_agent_documents": ("content", "chars", "version", "author", "actor", "updated_at", "deleted_at"),
    "memory_store_items": (
        "value",
        "indexed_text",
        "model",
        "dimension",
        "embedding",
        "version",
        "created_at",
        "updated_at",
        "deleted_at",
    ),
}
"""The columns the application updates, per table. No key column (``id``, ``tenant_id``,
``user_id``, ``agent_name``, ``scope_id``, ``fact_row_id``) is among them: the policies check a row's
owner and tenant, and PostgreSQL ORs the checks of every policy, so a role that could rewrite those
columns could hand a row to another owner, or take one. Tables missing here are never updated."""


def grant_statements(role: str, schema: str = "public") -> list[str]:
    """The grants, all of them idempotent: run again after a ``db upgrade`` that adds a table."""
    quoted, where = f'"{check_role_name(role)}"', f'"{schema}"'
    tables = ", ".join(f"{where}.{name}" for name in memory_tables())
    return [
        f"GRANT USAGE ON SCHEMA {where} TO {quoted}",
        f"GRANT SELECT, INSERT, DELETE ON TABLE {tables} TO {quoted}",
        *(
            f"GRANT UPDATE ({', '.join(columns)}) ON TABLE {where}.{table} TO {quoted}"
            for table, columns in UPDATABLE.items()
        ),
        f"GRANT USAGE, SELECT ON SEQUENCE {', '.join(f'{where}.{name}' for name in sequences())} TO {quoted}",
        f"GRANT SELECT ON TABLE {where}.{VERSION_TABLE} TO {quoted}",
    ]


def grant_app_role(
    engine: Engine, role: str, *, create: bool = False, password: str | None = None
) -> list[str]:
    """Create (``create``) and grant ``role`` on ``engine``'s database, in one transaction.

    Refuses a role that would not be bound by the policies: a superuser, a ``BYPASSRLS`` role or
    the owner of a memory table. Returns the statements run (the password as ``PASSWORD ***``).
    """
    if engine.dialect.name != "postgresql":
        raise ConfigError("application roles are PostgreSQL's: SQLite has no roles or row-level security")
    check_role_name(role)
    run: list[str] = []
    with engine.begin() as conn:
        schema = str(conn.execute(text("SELECT current_schema()")).scalar_one())
        exists = conn.execute(_ROLE_STATE, {"role": role}).first()
        if create:
            if exists is not None:
                raise ConfigError(f"role {role} already exists: leave out --create to grant to it")
            run.append(_execute(conn, create_statement(role)))
            if password is not None:
                conn.exec_driver_sql(f"ALTER ROLE \"{role}\" PASSWORD '{_verifier(conn, role, password)}'")
                run.append(f'ALTER ROLE "{role}" PASSWORD ***')
        elif exists is None:
            raise ConfigError(f"role {role} does not exist: pass --create to create it")
        elif exists[0]:
            raise ConfigError(
                f"role {role} is a superuser or has BYPASSRLS, so row-level security never applies to it: "
                "the application needs a role without either (ALTER ROLE ... NOSUPERUSER NOBYPASSRLS)"
            )
        owned = (
            conn.execute(_OWNED, {"schema": schema, "tables": memory_tables(), "role": role}).scalars().all()
        )
        if owned:
            raise ConfigError(
                f"role {role} owns {', '.join(owned)}: an owner can switch row-level security off; "
                "connect the application as a role that owns no memory table"
            )
        run.extend(_execute(conn, statement) for statement in grant_statements(role, schema))
    return run


def _execute(conn: Connection, statement: str) -> str:
    conn.exec_driver_sql(statement)
    return statement


def _verifier(conn: Connection, role: str, password: str) -> str:
    """libpq's encrypted form of ``password`` (the server's ``password_encryption``, SCRAM by default)."""
    driver = conn.connection.driver_connection
    pgconn = getattr(driver, "pgconn", None)
    if pgconn is None:
        raise ConfigError("setting a password needs the psycopg driver")
    verifier = bytes(pgconn.encrypt_password(password.encode("utf-8"), role.encode("utf-8"))).decode("ascii")
    if "'" in verifier:  # never: a verifier is base64 with $ and : separators
        raise ConfigError("unexpected password verifier")
    return verifier
