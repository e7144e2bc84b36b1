"""Revision 0009 on PostgreSQL deployments that run under row-level security.

Two ways an upgrade could go wrong without a trace: a table owner the policies bind (no
``BYPASSRLS``) migrating only the rows it can see, and an application role granted before 0009
losing access to the new tables. Each test makes its own database and roles and drops them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.schema.migrate import downgrade, upgrade
from memstore.storage.sql.schema.models import facts_table, scopes_table
from tests.support.app_role import app_role_url

pytestmark = pytest.mark.postgres


@pytest.fixture
def bound_owner_url(pg_url: str) -> Iterator[str]:
    """``pg_url``'s empty database as a new owner without ``BYPASSRLS`` (forced RLS binds it)."""
    role, password = f"memstore_owner_{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE ROLE \"{role}\" LOGIN NOSUPERUSER NOBYPASSRLS PASSWORD '{password}'"))
        conn.execute(text(f'ALTER SCHEMA public OWNER TO "{role}"'))
    try:
        yield make_url(pg_url).set(username=role, password=password).render_as_string(hide_password=False)
    finally:
        dispose_engines()
        with admin.connect() as conn:
            conn.execute(text('ALTER SCHEMA public OWNER TO "postgres"'))
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
        admin.dispose()


def test_a_bound_owner_migrates_every_row_and_cannot_downgrade_past_record_fields(
    pg_url: str, bound_owner_url: str
) -> None:
    upgrade(bound_owner_url, "0008")
    with create_engine(pg_url).begin() as conn:  # rows the application wrote, as the superuser sees them
        scope_id = conn.execute(
            insert(scopes_table).values(user_id="alice", revision=1).returning(scopes_table.c.id)
        ).scalar_one()
        for index, category in enumerate(("preference", "context", "goal")):
            conn.execute(
                insert(facts_table).values(
                    scope_id=scope_id, fact_id=f"f{index}", position=index, content=category,
                    content_key=category, category=category, confidence=0.9, extra={},
                    added_revision=1, updated_revision=1, created_at=datetime.now(UTC),
                )
            )  # fmt: skip
    upgrade(bound_owner_url)
    with create_engine(pg_url).connect() as conn:
        types: dict[str, str] = dict(
            conn.execute(text("SELECT category, memory_type FROM memory_facts")).all()
        )
        forced = conn.execute(text("SELECT relforcerowsecurity FROM pg_class WHERE relname = 'memory_facts'"))
        assert forced.scalar_one()  # forced again once the data statement ran
    assert types == {"preference": "preference", "context": "episodic", "goal": "profile"}

    with create_engine(pg_url).begin() as conn:
        conn.execute(text("UPDATE memory_facts SET importance = 0.9 WHERE fact_id = 'f0'"))
    dispose_engines()
    with pytest.raises(Exception, match="record fields"):
        downgrade(bound_owner_url, "0008")
    with create_engine(pg_url).connect() as conn:
        assert (
            conn.execute(text("SELECT importance FROM memory_facts WHERE fact_id = 'f0'")).scalar_one() == 0.9
        )


def test_an_application_role_granted_before_0009_keeps_working_after_the_upgrade(pg_url: str) -> None:
    upgrade(pg_url)
    with app_role_url(pg_url) as app_url:
        downgrade(pg_url, "0008")  # drops the new tables and columns, and the role's grants on them
        upgrade(pg_url)
        dispose_engines()
        storage = SqlMemoryStorage(app_url).for_identity("default")
        fact = {"id": "fact_00000001", "content": "likes tea", "importance": 0.9, "tags": ["tea"]}
        assert storage.save({"facts": [fact]}, None, user_id="alice")
        document = storage.reload(None, user_id="alice")
        assert document["facts"][0]["tags"] == ["tea"] and document["facts"][0]["importance"] == 0.9
        document["facts"][0]["importance"] = 0.4  # an UPDATE of a new column
        assert storage.save(document, None, user_id="alice")
        assert storage.reload(None, user_id="alice")["facts"][0]["importance"] == 0.4
