"""Provider fixtures: the storage contract suite runs against every provider listed here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memstore.storage.base import MemoryStorage
from memstore.storage.file import FileMemoryStorage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.migrate import upgrade

StorageFactory = Callable[[], MemoryStorage]


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    """A real SQLite file; the first storage built on it migrates it (the embedded default)."""
    yield f"sqlite:///{tmp_path / 'memory.db'}"
    dispose_engines()


@pytest.fixture
def postgres_url(pg_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database migrated to head the way a DBA does (``memstore db upgrade``)."""
    upgrade(pg_url)
    yield pg_url
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


@pytest.fixture(
    params=[
        pytest.param("file", id="file"),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgresql", marks=pytest.mark.postgres),
    ]
)
def storage_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorageFactory]:
    """Builds independent provider instances over one backing store (two "processes")."""
    if request.param == "file":
        yield lambda: FileMemoryStorage(tmp_path / "store")
        return
    url = str(request.getfixturevalue(f"{request.param}_url"))
    yield lambda: SqlMemoryStorage(url)


@pytest.fixture
def storage(storage_factory: StorageFactory) -> MemoryStorage:
    return storage_factory()
