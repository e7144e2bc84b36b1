"""Provider fixtures: the storage contract suite runs against every provider listed here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memstore.storage.base import MemoryStorage
from memstore.storage.file import FileMemoryStorage

StorageFactory = Callable[[], MemoryStorage]


@pytest.fixture(params=["file"])
def storage_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorageFactory]:
    """Builds independent provider instances over one backing store (two "processes")."""
    if request.param == "file":
        yield lambda: FileMemoryStorage(tmp_path / "store")
    else:  # pragma: no cover - guarded by params
        raise AssertionError(request.param)


@pytest.fixture
def storage(storage_factory: StorageFactory) -> MemoryStorage:
    return storage_factory()
