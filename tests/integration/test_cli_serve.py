"""``memstore serve`` launched for real through the console entry point, spoken to over HTTP."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from memstore.scope import make_safe_user_id
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines

STARTUP_ATTEMPTS = 600  # polls 0.1 s apart: generous for a loaded 2-core machine


def _memstore() -> str:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    return executable


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    base: str
    stdout: str = ""


@contextmanager
def running_server(args: list[str], data_dir: Path) -> Iterator[Server]:
    """Start ``memstore serve`` on a free port, yield once it answers HTTP; ``stdout`` is set on exit."""
    port = _free_port()
    env = {**os.environ, "MEMSTORE_DATA_DIR": str(data_dir)}
    process = subprocess.Popen(
        [_memstore(), "serve", "--port", str(port), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    server = Server(f"http://127.0.0.1:{port}")
    try:
        for _ in range(STARTUP_ATTEMPTS):
            if process.poll() is not None:
                raise AssertionError(f"memstore serve exited: {process.communicate()}")
            try:
                httpx.get(f"{server.base}/openapi.json")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("memstore serve never answered")
        yield server
    finally:
        process.terminate()
        server.stdout, _ = process.communicate(timeout=30)


def stored_facts(data_dir: Path, user_id: str) -> list[str]:
    try:
        memory = SqlMemoryStorage(f"sqlite:///{data_dir / 'memory.db'}").load(user_id=user_id)
        return [fact["content"] for fact in memory["facts"]]
    finally:
        dispose_engines()


def test_serves_one_fixed_user(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with running_server(["--user", "alice"], data_dir) as server:
        created = httpx.post(f"{server.base}/api/memory/facts", json={"content": "Served over HTTP"})
        assert created.status_code == 200, created.text
        memory = httpx.get(f"{server.base}/api/memory").json()
        assert [f["content"] for f in memory["facts"]] == ["Served over HTTP"]
    assert f"serving {server.base}/api/memory" in server.stdout
    assert "every request acts as user 'alice'" in server.stdout
    assert stored_facts(data_dir, "alice") == ["Served over HTTP"]


def test_trusted_header_identity(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with running_server(["--user-header", "X-Forwarded-User"], data_dir) as server:
        assert httpx.get(f"{server.base}/api/memory").status_code == 401
        headers = {"X-Forwarded-User": "carol@example.com"}
        created = httpx.post(
            f"{server.base}/api/memory/facts", json={"content": "Via the proxy"}, headers=headers
        )
        assert created.status_code == 200, created.text
    assert "taken from the X-Forwarded-User header" in server.stdout
    assert stored_facts(data_dir, make_safe_user_id("carol@example.com")) == ["Via the proxy"]


def test_refuses_to_start_without_an_identity_source(tmp_path: Path) -> None:
    env = {**os.environ, "MEMSTORE_DATA_DIR": str(tmp_path / "data")}
    result = subprocess.run([_memstore(), "serve"], capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 2
    assert "--user ID" in result.stderr and "--user-header NAME" in result.stderr
    invalid = subprocess.run(
        [_memstore(), "serve", "--user", "../etc"], capture_output=True, text=True, env=env, check=False
    )
    assert invalid.returncode == 1
    assert "Invalid user_id" in invalid.stderr
