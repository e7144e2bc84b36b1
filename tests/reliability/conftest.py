"""Fixtures for the reliability suite: real databases, the stub LLM, and a figures recorder.

Set ``MEMSTORE_RELIABILITY_REPORT=path.jsonl`` to have every test append what it tried and
what was lost; docs/reliability.md is written from such a run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memstore.config import FILE_STORAGE_CLASS, MemoryConfig, set_memory_config
from memstore.queue import reset_memory_queue
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sql.engine import dispose_engines
from memstore.storage.sql.schema.migrate import upgrade
from tests.support.openai_server import OpenAIStubServer
from tests.support.pg_cluster import PgCluster, private_cluster

REPORT_ENV = "MEMSTORE_RELIABILITY_REPORT"

Record = Callable[..., None]


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Record:
    """``record(tried=..., lost=..., **details)``: print the figures and append them to the report."""

    def emit(**figures: Any) -> None:
        line = {"test": request.node.nodeid, **figures}
        print(json.dumps(line, sort_keys=True))
        path = os.environ.get(REPORT_ENV)
        if path:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(line, sort_keys=True) + "\n")

    return emit


def configure(**values: Any) -> MemoryConfig:
    """Install a config as the process-wide one and drop the storage built from the previous one."""
    config = MemoryConfig(**values)
    set_memory_config(config)
    reset_memory_storage()
    return config


def llm_settings(server: OpenAIStubServer) -> dict[str, Any]:
    return {
        "extractor": "llm",
        "llm_base_url": server.base_url,
        "model_name": "stub-model",
        "llm_timeout_seconds": 30.0,
    }


@pytest.fixture(autouse=True)
def _no_process_queue() -> Iterator[None]:
    reset_memory_queue()
    yield
    reset_memory_queue()


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgresql", marks=pytest.mark.postgres),
        pytest.param("file", id="file"),
    ]
)
def store_settings(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """Config values for a fresh store, once per provider, to pass to ``configure``."""
    if request.param == "file":
        return {"storage_class": FILE_STORAGE_CLASS, "data_dir": str(tmp_path / "files")}
    return {"database_url": str(request.getfixturevalue(f"{request.param}_url"))}


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    """A private PostgreSQL cluster the outage tests may stop, freeze and restart."""
    with private_cluster() as running:
        yield running


@pytest.fixture
def outage_url(cluster: PgCluster) -> Iterator[str]:
    """A migrated database on ``cluster``, which is left running (thawed or restarted) afterwards."""
    try:
        with cluster.database() as url:
            upgrade(url)
            yield url
            dispose_engines()
            if (cluster.data / "postmaster.pid").exists():
                cluster.thaw()
            else:
                cluster.start()
    finally:
        dispose_engines()
