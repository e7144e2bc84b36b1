"""Provider fixtures: the storage contract suite runs against every provider listed here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memstore.storage.base import MemoryStorage
from memstore.storage.file import FileMemoryStorage
from memstore.storage.sql import SqlMemoryStorage

StorageFactory = Callable[[], MemoryStorage]


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
