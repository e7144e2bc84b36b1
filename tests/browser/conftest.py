"""A real Chromium (Debian's ``chromium``, driven by Playwright) against a real ``memstore serve
--console`` on SQLite and on PostgreSQL.

One browser per test session and one server per backend per module keep the suite fast; each test
gets a fresh browser context (cookies, headers). Without Chromium or Playwright the tests skip
locally and fail under ``CI=true``: CI must run them. Playwright never downloads a browser here.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.seed import Seeded, seed
from tests.support.postgres import fresh_database

CHROMIUM_ENV = "MEMSTORE_TEST_CHROMIUM"
"""The Chromium binary (``scripts/with-chromium.sh`` exports it); unset: Debian's /usr/bin/chromium."""
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
USER_HEADER = "X-Forwarded-User"
ROLES_HEADER = "X-Forwarded-Roles"
ADMIN = {USER_HEADER: "ops@example.com", ROLES_HEADER: "admin"}
STARTUP_ATTEMPTS = 600  # 0.1 s apart: generous for a loaded 2-core machine
SCREENSHOTS_ENV = "MEMSTORE_TEST_CONSOLE_SCREENSHOTS"
"""A directory: the page-load test saves a screenshot of every page there (docs/console/)."""


def _missing(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI must run the console's browser tests", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module.

    Not per session: Playwright's sync API keeps an event loop running on the thread while it is
    open, and a later test of another module on the same xdist worker could then not call
    ``asyncio.run``. Pytest closes a module's fixtures before the next module's test runs.
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (the dev extra has it)")
    chromium = Path(os.environ.get(CHROMIUM_ENV) or "/usr/bin/chromium")
    if not chromium.exists():
        _missing(f"{chromium} is missing (apt-get install chromium, or set {CHROMIUM_ENV})")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Console:
    """A running ``memstore serve --console`` and the database behind it."""

    base: str
    url: str
    seeded: Seeded
    backend: str

    @property
    def shell(self) -> str:
        return f"{self.base}/console/"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def _serving(url: str, data_dir: Path) -> Iterator[str]:
    memstore = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert memstore is not None
    port = _free_port()
    env = {
        **os.environ,
        "MEMSTORE_DATA_DIR": str(data_dir),
        "MEMSTORE_DATABASE_URL": url,
        "MEMSTORE_EXPIRE_BELOW": "0.3",
    }
    args = [
        "serve",
        "--console",
        "--port",
        str(port),
        "--user-header",
        USER_HEADER,
        "--roles-header",
        ROLES_HEADER,
    ]
    process = subprocess.Popen(
        [memstore, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(STARTUP_ATTEMPTS):
            if process.poll() is not None:
                raise AssertionError(f"memstore serve exited: {process.communicate()[0]}")
            try:
                httpx.get(f"{base}/healthz")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("memstore serve never answered")
        yield base
    finally:
        process.terminate()
        process.communicate(timeout=30)


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def console(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """The console on a seeded database of each backend (``tests/browser/seed.py``)."""
    data_dir = tmp_path_factory.mktemp("console")
    with ExitStack() as stack:
        if request.param == "postgres":
            server_url = request.getfixturevalue("pg_server_url")
            template = request.getfixturevalue("pg_template")
            url = stack.enter_context(fresh_database(server_url, template=template))
        else:
            url = f"sqlite:///{data_dir / 'memory.db'}"
        seeded = seed(url, data_dir)
        base = stack.enter_context(_serving(url, data_dir))
        yield Console(base, url, seeded, request.param)


@dataclass
class Watched:
    """A page whose console errors and uncaught exceptions are collected."""

    page: Any
    errors: list[str]


def open_page(browser: Any, headers: dict[str, str], viewport: tuple[int, int] = (1280, 900)) -> Watched:
    context = browser.new_context(
        extra_http_headers=headers, viewport={"width": viewport[0], "height": viewport[1]}
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    return Watched(page, errors)


@pytest.fixture
def admin(browser: Any) -> Iterator[Watched]:
    """A page of an admin caller (the proxy's headers on every request)."""
    watched = open_page(browser, ADMIN)
    yield watched
    watched.page.context.close()
