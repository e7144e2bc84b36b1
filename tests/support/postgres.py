"""Fresh, uniquely named PostgreSQL databases for tests, created on the server in MEMSTORE_TEST_PG_URL."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PG_URL_ENV = "MEMSTORE_TEST_PG_URL"
PGBOUNCER_URL_ENV = "MEMSTORE_TEST_PGBOUNCER_URL"
THROUGH_PGBOUNCER_ENV = "MEMSTORE_TEST_THROUGH_PGBOUNCER"
"""Set (to 1) by ``make test``'s second pass: every fresh database is reached through PgBouncer."""


def configured_url_or_skip(variable: str, server: str) -> str:
    """The server URL in ``variable``; a visible skip locally, a hard failure in CI."""
    url = os.environ.get(variable)
    if url:
        return url
    message = f"{variable} is not set: {server} tests need a server (make test starts one)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + "; CI must not skip them", pytrace=False)
    pytest.skip(message)


def server_url_or_skip() -> str:
    return configured_url_or_skip(PG_URL_ENV, "PostgreSQL")


def pgbouncer_url_or_skip() -> str:
    return configured_url_or_skip(PGBOUNCER_URL_ENV, "PgBouncer")


def through_pgbouncer(url: str) -> str:
    """``url``'s database and role reached through the PgBouncer of MEMSTORE_TEST_PGBOUNCER_URL, with
    server-side prepared statements off (``?prepare_threshold=none``), as docs/scale.md asks."""
    bouncer = make_url(pgbouncer_url_or_skip())
    routed = make_url(url).set(host=bouncer.host, port=bouncer.port)
    return routed.update_query_dict({"prepare_threshold": "none"}).render_as_string(hide_password=False)


def routed_through_pgbouncer() -> bool:
    return os.environ.get(THROUGH_PGBOUNCER_ENV, "") == "1"


@contextmanager
def fresh_database(server_url: str, template: str | None = None) -> Iterator[str]:
    """Create ``memstore_t_<hex>`` on the server, yield its URL, drop it afterwards.

    ``template`` names a database to copy (one already migrated to head: cheaper than migrating).
    Creating and dropping stay on the server itself; the URL handed out goes through PgBouncer in
    ``make test``'s pooled pass (``MEMSTORE_TEST_THROUGH_PGBOUNCER``).
    """
    url = make_url(server_url).set(drivername="postgresql+psycopg")
    name = f"memstore_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            if template and routed_through_pgbouncer():
                # PgBouncer keeps idle server connections to the template, which a copy may not have.
                conn.execute(
                    text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                    {"name": template},
                )
            conn.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
        fresh = url.set(database=name).render_as_string(hide_password=False)
        yield through_pgbouncer(fresh) if routed_through_pgbouncer() else fresh
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
