"""``memstore serve`` launched for real through the console entry point, spoken to over HTTP."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from memstore.document import MAX_DOCUMENT_BYTES
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
        _check_offline_docs(server.base)
    assert f"serving {server.base}/api/memory" in server.stdout
    assert "every request acts as user 'alice'" in server.stdout
    assert stored_facts(data_dir, "alice") == ["Served over HTTP"]


def _check_offline_docs(base: str) -> None:
    """/docs and /redoc name no CDN, and the assets they do name are served by memstore itself."""
    for page in ("/docs", "/redoc"):
        html = httpx.get(f"{base}{page}")
        assert html.status_code == 200, page
        assert "cdn.jsdelivr.net" not in html.text and "fonts.googleapis.com" not in html.text, page
        assets = re.findall(r'(?:src|href)="(/static-offline-docs/[^"]+)"', html.text)
        assert assets, page
        for asset in assets:
            served = httpx.get(f"{base}{asset}")
            assert served.status_code == 200 and len(served.content) > 1000, asset


def test_trusted_header_identity(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with running_server(["--user-header", "X-Forwarded-User"], data_dir) as server:
        assert httpx.get(f"{server.base}/api/memory").status_code == 401
        # The probes need no identity and show no memory.
        assert httpx.get(f"{server.base}/healthz").json() == {"status": "ok"}
        ready = httpx.get(f"{server.base}/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
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
    assert invalid.returncode == 2  # a usage error, before anything is opened
    assert "Invalid value for '--user': Invalid user_id" in invalid.stderr


def _raw_status(base: str, head: str, chunks: Iterable[bytes] = ()) -> int:
    """Send a hand-made HTTP/1.1 request (``head`` without the blank line) and return the status."""
    url = httpx.URL(base)
    assert url.port is not None
    with socket.create_connection((url.host, url.port), timeout=120) as connection:
        connection.sendall(head.replace("\n", "\r\n").encode() + b"\r\n")
        for chunk in chunks:
            connection.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = b""
        while b"\r\n" not in answer:
            data = connection.recv(4096)
            assert data, f"connection closed after {answer!r}"
            answer += data
    return int(answer.split(b" ", 2)[1])


def test_header_identity_is_one_copy_of_the_header_and_hosts_are_checked(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with running_server(["--user-header", "X-Forwarded-User"], data_dir) as server:
        carol = {"X-Forwarded-User": "carol@example.com"}
        created = httpx.post(
            f"{server.base}/api/memory/facts", json={"content": "Carol's plan"}, headers=carol
        )
        assert created.status_code == 200, created.text
        # A user whose proxy name is carol's mapped id is someone else (issue 13, item 3).
        impostor = {"X-Forwarded-User": make_safe_user_id("carol@example.com")}
        assert httpx.get(f"{server.base}/api/memory", headers=impostor).json()["facts"] == []

        # A proxy that appends its header after the client's would let the client's copy win.
        twice = [("X-Forwarded-User", "mallory@example.com"), ("X-Forwarded-User", "carol@example.com")]
        duplicated = httpx.get(f"{server.base}/api/memory", headers=twice)
        assert duplicated.status_code == 400, duplicated.text
        assert "sent 2 times" in duplicated.json()["detail"]

        # DNS rebinding: a foreign page reaching 127.0.0.1 still sends its own name as Host.
        rebound = httpx.get(f"{server.base}/api/memory", headers={**carol, "Host": "attacker.example"})
        assert rebound.status_code == 400
        port = httpx.URL(server.base).port
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
            assert httpx.get(f"{server.base}/api/memory", headers={**carol, "Host": host}).status_code == 200

        # The API description needs no identity; memory does.
        assert httpx.get(f"{server.base}/docs").status_code == 200
        assert "/api/memory/facts" in httpx.get(f"{server.base}/openapi.json").json()["paths"]
        assert httpx.get(f"{server.base}/api/memory/config").status_code == 401
    assert "accepting Host 127.0.0.1, [::1], localhost" in server.stdout


def test_configured_hosts_and_the_request_body_limit(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with running_server(["--user", "alice", "--allowed-host", "memory.example.com"], data_dir) as server:
        named = {"Host": "memory.example.com"}
        assert httpx.get(f"{server.base}/api/memory", headers=named).status_code == 200
        assert httpx.get(f"{server.base}/api/memory").status_code == 400  # 127.0.0.1 was not named

        head = "POST /api/memory/facts HTTP/1.1\nHost: memory.example.com\nContent-Type: application/json\n"
        # Refused on the declared length alone: none of the 200 MB is sent or read.
        assert _raw_status(server.base, head + "Content-Length: 200000000\n") == 413
        # Chunked: refused once the bytes received pass the limit.
        chunk = b" " * (1 << 20)
        chunks = [chunk] * (MAX_DOCUMENT_BYTES // len(chunk) + 1)
        assert _raw_status(server.base, head + "Transfer-Encoding: chunked\n", chunks) == 413
        just_under = json.dumps({"content": "Fits"}).encode().ljust(MAX_DOCUMENT_BYTES)
        json_headers = {**named, "Content-Type": "application/json"}
        fits = httpx.post(f"{server.base}/api/memory/facts", content=just_under, headers=json_headers)
        assert fits.status_code == 200, fits.text
    assert stored_facts(data_dir, "alice") == ["Fits"]


def test_a_wildcard_address_needs_named_hosts(tmp_path: Path) -> None:
    env = {**os.environ, "MEMSTORE_DATA_DIR": str(tmp_path / "data")}
    result = subprocess.run(
        [_memstore(), "serve", "--user", "alice", "--host", "0.0.0.0", "--port", str(_free_port())],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert result.returncode == 2
    assert "--allowed-host" in result.stderr
