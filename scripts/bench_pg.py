"""The benchmark's own PostgreSQL database: created on the server, migrated, dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.schema.migrate import upgrade

PG_URL_ENV = "MEMSTORE_BENCH_PG_URL"


@contextmanager
def empty_database(server_url: str) -> Iterator[str]:
    """Create ``memstore_bench_<hex>`` empty, yield its URL and drop it, whatever happens."""
    url = make_url(server_url).set(drivername="postgresql+psycopg")
    name = f"memstore_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield url.set(database=name).render_as_string(hide_password=False)
        finally:
            dispose_engines()  # our pools must let go before the drop
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@contextmanager
def bench_database(server_url: str) -> Iterator[str]:
    """``empty_database`` migrated to head."""
    with empty_database(server_url) as database_url:
        upgrade(database_url)
        yield database_url


def connect(database_url: str) -> Any:
    """An autocommit psycopg connection, as the floors need: no BEGIN/ROLLBACK around a SELECT."""
    conninfo = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    return psycopg.connect(conninfo, autocommit=True)


def durability(conn: Any) -> str:
    """What a commit costs on this server, read from its settings rather than assumed."""
    fsync = conn.execute("SHOW fsync").fetchone()[0]
    synchronous = conn.execute("SHOW synchronous_commit").fetchone()[0]
    if fsync == "on" and synchronous != "off":
        return f"power-loss-safe (WAL fsync per commit: fsync=on, synchronous_commit={synchronous})"
    return f"NOT power-loss-safe on this server (fsync={fsync}, synchronous_commit={synchronous})"
