"""Revision 0011 applied to a database whose application role already exists: ``db upgrade``
alone grants the role the new tables, exactly what ``memstore db grant-app-role`` grants, so a
deployment that upgrades does not find its agent documents refused with "permission denied"."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from memstore.agent_doc import MAIN_DOC_PATH, DocScope
from memstore.config import MemoryConfig, set_memory_config
from memstore.ops import agent_docs as ops
from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.schema import migrate
from tests.support.app_role import app_role_url

pytestmark = pytest.mark.postgres

TABLES = ("memory_agent_documents", "memory_agent_document_versions")
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")


def _privileges(url: str, role: str) -> dict[str, set[str]]:
    """The role's table privileges on the new tables and the columns it may update."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found: dict[str, set[str]] = {}
            for table in TABLES:
                found[table] = {
                    privilege
                    for privilege in PRIVILEGES
                    if conn.execute(
                        text("SELECT has_table_privilege(:r, :t, :p)"),
                        {"r": role, "t": table, "p": privilege},
                    ).scalar_one()
                }
                found[f"{table} columns"] = set(
                    conn.execute(
                        text(
                            "SELECT column_name FROM information_schema.column_privileges "
                            "WHERE grantee = :r AND table_name = :t AND privilege_type = 'UPDATE'"
                        ),
                        {"r": role, "t": table},
                    ).scalars()
                )
            return found
    finally:
        engine.dispose()


def test_upgrading_to_0011_grants_the_existing_app_role_what_grant_app_role_would(pg_url: str) -> None:
    migrate.upgrade(pg_url)
    with app_role_url(pg_url, "memstore_pre11") as app_url:
        role = str(make_url(app_url).username)
        granted = _privileges(pg_url, role)  # what grant-app-role gives at head
        assert granted["memory_agent_documents"] == {"SELECT", "INSERT", "DELETE"}
        assert granted["memory_agent_documents columns"] == {
            "content",
            "chars",
            "version",
            "author",
            "actor",
            "updated_at",
            "deleted_at",
        }
        assert granted["memory_agent_document_versions"] == {"SELECT", "INSERT", "DELETE"}
        assert granted["memory_agent_document_versions columns"] == set()
        # Back to 0010 (the tables go, the role's grants on them too), then up again by db upgrade alone.
        migrate.downgrade(pg_url, "0010")
        migrate.upgrade(pg_url)
        assert _privileges(pg_url, role) == granted
        dispose_engines()
        set_memory_config(MemoryConfig(database_url=app_url))
        ops.reset_agent_doc_stores()
        scope = DocScope("coder", "alice", "acme")
        ops.write_doc(scope, MAIN_DOC_PATH, "one", expected_version=0, author="agent")
        ops.edit_doc(scope, MAIN_DOC_PATH, "one", "two", expected_version=1, author="agent")
        assert ops.read_doc(scope, MAIN_DOC_PATH).content == "two"
        ops.reset_agent_doc_stores()
