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


@contextmanager
def fresh_database(server_url: str, template: str | None = None) -> Iterator[str]:
    """Create ``memstore_t_<hex>`` on the server, yield its URL, drop it afterwards.

    ``template`` names a database to copy (one already migrated to head: cheaper than migrating).
    """
    url = make_url(server_url).set(drivername="postgresql+psycopg")
    name = f"memstore_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
        yield url.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
