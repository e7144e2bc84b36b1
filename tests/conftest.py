"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from memstore.config import MemoryConfig, set_memory_config
from memstore.storage.loader import reset_memory_storage
from tests.support.openai_server import OpenAIStubServer, RunningServer
from tests.support.postgres import fresh_database, server_url_or_skip


@pytest.fixture(autouse=True)
def isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryConfig]:
    """Every test starts with default settings and its own data directory."""
    for name in ("MEMSTORE_CONFIG", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    config = MemoryConfig(data_dir=str(tmp_path / "data"))
    set_memory_config(config)
    reset_memory_storage()
    yield config
    reset_memory_storage()
    set_memory_config(None)


@pytest.fixture
def openai_server() -> Iterator[OpenAIStubServer]:
    with RunningServer() as server:
        yield server


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    return server_url_or_skip()


@pytest.fixture
def pg_url(pg_server_url: str) -> Iterator[str]:
    """A brand-new PostgreSQL database for one test, dropped afterwards."""
    with fresh_database(pg_server_url) as url:
        yield url
