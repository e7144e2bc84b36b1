"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url

from memstore.config import MemoryConfig, set_memory_config
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sessions.loader import reset_session_stores
from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.schema.migrate import upgrade
from tests.support.faces import AsyncFace, Face, SyncFace
from tests.support.openai_server import OpenAIStubServer, RunningServer
from tests.support.postgres import fresh_database, routed_through_pgbouncer, server_url_or_skip
from tests.support.redis_server import redis_url_or_skip


def pytest_configure() -> None:
    """In the pass through PgBouncer, the tests' own engines (``create_engine`` on a test database's
    URL, to look at rows as the server's owner) read ``?prepare_threshold=none`` as memstore's engines
    do; memstore's own handling of it is proven in the direct pass (tests/integration/test_pgbouncer.py,
    which also checks that every engine memstore builds comes from engine.py's builders)."""
    if routed_through_pgbouncer():
        event.listen(Engine, "do_connect", _prepare_threshold_none)


def _prepare_threshold_none(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
    # Only the URL's text: memstore's own engines have already handed psycopg None.
    if isinstance(cparams.get("prepare_threshold"), str):
        cparams["prepare_threshold"] = None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that asks for the PostgreSQL server is a ``postgres`` test, as the dialect-parametrised
    ones are marked: ``make test``'s pass through PgBouncer selects them with ``-m postgres``."""
    for item in items:
        if "pg_server_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(autouse=True)
def isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryConfig]:
    """Every test starts with default settings and its own data directory."""
    for name in ("MEMSTORE_CONFIG", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    config = MemoryConfig(data_dir=str(tmp_path / "data"))
    set_memory_config(config)
    reset_memory_storage()
    reset_session_stores()
    yield config
    reset_memory_storage()
    reset_session_stores()
    set_memory_config(None)


@pytest.fixture
def openai_server() -> Iterator[OpenAIStubServer]:
    with RunningServer() as server:
        yield server


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> Iterator[Face]:
    """memstore's API on one face, then the other: the shared sync/async contract suite."""
    chosen: Face = SyncFace() if request.param == "sync" else AsyncFace()
    try:
        yield chosen
    finally:
        chosen.close()


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    return server_url_or_skip()


@pytest.fixture
def pg_url(pg_server_url: str) -> Iterator[str]:
    """A brand-new PostgreSQL database for one test, dropped afterwards."""
    with fresh_database(pg_server_url) as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis server of MEMSTORE_TEST_REDIS_URL; every test keeps to its own key prefix."""
    return redis_url_or_skip()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite file per test session (per xdist worker), migrated to head as a first start does.

    Running the migration chain costs 0.1-0.5 s a database; a copy costs a millisecond. What a
    fresh file's first start does is tested on fresh files (tests/integration/test_migrations.py).
    """
    path = tmp_path_factory.mktemp("sqlite-template") / "memory.db"
    upgrade(f"sqlite:///{path}")
    dispose_engines()  # the last connection's close checkpoints the WAL into the file
    assert not path.with_name("memory.db-wal").exists(), "the template's WAL was not checkpointed"
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> Iterator[str]:
    """A real SQLite file at head: a copy of the session's migrated template."""
    target = tmp_path / "memory.db"
    shutil.copyfile(sqlite_template, target)
    yield f"sqlite:///{target}"
    dispose_engines()


@pytest.fixture(scope="session")
def pg_template(pg_server_url: str) -> Iterator[str]:
    """One database per test session (per xdist worker), migrated to head the way a DBA does.

    ``memstore db upgrade`` is what it runs (``migrate.upgrade``); each test then copies it with
    ``CREATE DATABASE ... TEMPLATE``, which costs less than running the migrations again.
    """
    with fresh_database(pg_server_url) as url:
        upgrade(url)
        dispose_engines()  # a template must have no open connection when it is copied
        yield str(make_url(url).database)


@pytest.fixture
def postgres_url(pg_server_url: str, pg_template: str) -> Iterator[str]:
    """A fresh PostgreSQL database at head: a copy of the session's migrated template."""
    with fresh_database(pg_server_url, template=pg_template) as url:
        yield url
        # Close our pools before the fixture drops the database.
        dispose_engines()


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgresql", marks=pytest.mark.postgres),
    ]
)
def sql_url(request: pytest.FixtureRequest) -> str:
    """A fresh, migrated database URL, once per SQL dialect."""
    return str(request.getfixturevalue(f"{request.param}_url"))
