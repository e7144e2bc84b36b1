"""storage_class is loaded by reflection and fails loudly, never falling back."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import ConfigError
from memstore.storage.file import FileMemoryStorage
from memstore.storage.loader import get_memory_storage, load_storage_class, reset_memory_storage


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("nope.Nope", "cannot import"),
        ("memstore.storage.file.Missing", "has no"),
        ("memstore.storage.file.FILE_NAME", "not a class"),
        ("memstore.config.MemoryConfig", "not a subclass"),
    ],
)
def test_bad_storage_class_names_the_setting(path: str, reason: str) -> None:
    with pytest.raises(ConfigError, match="storage_class") as info:
        load_storage_class(path)
    assert reason in str(info.value)


def test_bad_storage_class_from_environment_exits_non_zero() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import memstore; memstore.get_memory_storage()"],
        env={"MEMSTORE_STORAGE_CLASS": "nope.Nope", "PATH": ""},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "storage_class" in result.stderr


def test_storage_is_built_once_across_threads() -> None:
    set_memory_config(MemoryConfig(storage_class="memstore.storage.file.FileMemoryStorage"))
    seen: list[object] = []
    threads = [threading.Thread(target=lambda: seen.append(get_memory_storage())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(s) for s in seen}) == 1
    assert isinstance(seen[0], FileMemoryStorage)
    reset_memory_storage()
    assert get_memory_storage() is not seen[0]
