"""Provider fixtures (the storage contract suite runs on every provider listed here) and the CLI runner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from memstore.config import MemoryConfig
from memstore.queue import reset_memory_queue
from memstore.storage.base import MemoryStorage
from memstore.storage.file import FileMemoryStorage
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.maintenance.partition import partition
from memstore.storage.sql.schema.migrate import upgrade
from tests.support.openai_server import OpenAIStubServer
from tests.support.postgres import fresh_database
from tests.support.semantic import MODEL

StorageFactory = Callable[[], MemoryStorage]


@pytest.fixture(
    params=[
        pytest.param("file", id="file"),
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgresql", marks=pytest.mark.postgres),
        pytest.param("postgres_partitioned", id="postgresql-partitioned", marks=pytest.mark.postgres),
    ]
)
def storage_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StorageFactory]:
    """Builds independent provider instances over one backing store (two "processes")."""
    if request.param == "file":
        yield lambda: FileMemoryStorage(tmp_path / "store")
        return
    url = str(request.getfixturevalue(f"{request.param}_url"))
    yield lambda: SqlMemoryStorage(url)


@pytest.fixture(scope="session")
def pg_partitioned_template(pg_server_url: str) -> Iterator[str]:
    """A database at head moved to the partitioned layout (``memstore db partition``), once per session."""
    with fresh_database(pg_server_url) as url:
        upgrade(url)
        partition(get_engine(url), partitions=4)
        dispose_engines()  # a template must have no open connection when it is copied
        yield str(make_url(url).database)


@pytest.fixture
def postgres_partitioned_url(pg_server_url: str, pg_partitioned_template: str) -> Iterator[str]:
    """A fresh PostgreSQL database on the partitioned layout: a copy of the session's template."""
    with fresh_database(pg_server_url, template=pg_partitioned_template) as url:
        yield url
        dispose_engines()


@pytest.fixture
def storage(storage_factory: StorageFactory) -> MemoryStorage:
    return storage_factory()


@dataclass
class Cli:
    env: dict[str, str]
    url: str

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
        assert executable is not None
        return subprocess.run(
            [executable, *args], capture_output=True, text=True, env=self.env, input=stdin, check=False
        )

    def json(self, *args: str) -> Any:
        result = self(*args, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def cli(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_DATA_DIR"] = str(tmp_path / "data")
    if request.param == "postgresql":
        url = str(request.getfixturevalue("pg_url"))
        env["MEMSTORE_DATABASE_URL"] = url
        runner = Cli(env, url)
        upgraded = runner("db", "upgrade")
        assert upgraded.returncode == 0, upgraded.stderr
    else:
        runner = Cli(env, f"sqlite:///{tmp_path / 'data' / 'memory.db'}")
    yield runner
    dispose_engines()


@pytest.fixture
def sql_storage(sql_url: str, isolated_config: MemoryConfig) -> Iterator[SqlMemoryStorage]:
    """The process-wide SQL provider on ``sql_url``, as the middleware, tools and routes use it."""
    isolated_config.database_url = sql_url
    reset_memory_storage()
    reset_memory_queue()
    storage = get_memory_storage()
    assert isinstance(storage, SqlMemoryStorage)
    yield storage
    reset_memory_queue()
    reset_memory_storage()


@pytest.fixture
def semantic(
    sql_storage: SqlMemoryStorage, isolated_config: MemoryConfig, openai_server: OpenAIStubServer
) -> SqlMemoryStorage:
    """``sql_storage`` with embeddings from the test server (read from the config at each use)."""
    isolated_config.embedding_model = MODEL
    isolated_config.embedding_base_url = openai_server.base_url
    isolated_config.embedding_provider = "openai"
    isolated_config.dedup_similarity = 0.8
    return sql_storage
