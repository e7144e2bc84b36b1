"""A throwaway application role that PostgreSQL's row-level security binds, for one test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.schema.roles import grant_app_role


@contextmanager
def app_role_url(owner_url: str, prefix: str = "memstore_app") -> Iterator[str]:
    """``owner_url``'s database as a new role made by ``grant_app_role``; the role, and what it was
    granted, are dropped afterwards (the database itself is the caller's)."""
    role, password = f"{prefix}_{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    owner = create_engine(owner_url, isolation_level="AUTOCOMMIT")
    try:
        grant_app_role(owner, role, create=True, password=password)
        yield make_url(owner_url).set(username=role, password=password).render_as_string(hide_password=False)
    finally:
        dispose_engines()  # the role's pooled connections, before it can be dropped
        with owner.connect() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
        owner.dispose()
