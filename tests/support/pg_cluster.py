"""A private PostgreSQL cluster that a test may stop, start and freeze (outage tests).

The shared test server must never go down under other tests, so outage tests get their own
cluster: ``initdb`` in a temp dir, ``pg_ctl`` on a free loopback port. Both refuse to run as
root, so as root they run through ``runuser -u postgres --`` (the recipe of
scripts/with-postgres.sh). Without server binaries the tests skip visibly, except under
``CI=true`` where they must run.

``replicated_cluster`` adds a streaming replica of such a cluster (``pg_basebackup -R``, a hot
standby on its own port), for the read-replica tests.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

SERVER_OPTIONS = (
    "-c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off "
    "-c max_connections=100"
)


def _pg_bin() -> Path | None:
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda path: int(path.parent.name.split(".")[0])
    )
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _unavailable(reason: str) -> None:
    message = f"private PostgreSQL cluster unavailable: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + "; CI must run the outage tests", pytrace=False)
    pytest.skip(message)


class PgCluster:
    """One initdb'd data directory and the server running on it."""

    def __init__(self, bindir: Path, root: Path, port: int) -> None:
        self.bindir = bindir
        self.root = root
        self.port = port
        self.data = root / "data"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    def clone(self, primary: PgCluster) -> None:
        """This cluster as a streaming replica of ``primary``: its base backup, streamed WAL and,
        from ``-R``, ``standby.signal`` and the connection to ``primary`` (initdb's trust rules
        already admit replication from 127.0.0.1)."""
        self._run(
            "pg_basebackup", "-D", str(self.data), "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", "postgres", "-X", "stream", "-R", "-c", "fast", "--no-sync",
        )  # fmt: skip

    def start(self) -> None:
        options = f"{SERVER_OPTIONS} -p {self.port} -k {self.root}"
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
            "-o", options, "start",
        )  # fmt: skip

    def stop(self) -> None:
        """A fast shutdown: sessions are disconnected, new connections are refused."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def _server_pids(self) -> list[int]:
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                fields = dict(
                    line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
                )
            except OSError:
                continue
            if fields.get("PPid", "").strip() == str(postmaster):
                children.append(int(status.parent.name))
        return [postmaster, *children]

    @contextmanager
    def database(self) -> Iterator[str]:
        """A new database on this cluster, dropped afterwards.

        Each step uses its own short-lived engine: a pooled admin connection would not survive
        the restarts the test puts the cluster through.
        """
        name = f"memstore_outage_{uuid.uuid4().hex[:12]}"
        self._admin(f'CREATE DATABASE "{name}"')
        try:
            yield self.url.rsplit("/", 1)[0] + f"/{name}"
        finally:
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, statement: str) -> None:
        engine = create_engine(self.url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(text(statement))
        finally:
            engine.dispose()

    def freeze(self) -> None:
        """SIGSTOP the server: connections hang instead of failing (a network black hole)."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, signum: signal.Signals) -> None:
        # A backend may exit between listing the server's processes and signalling it.
        for pid in self._server_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


@contextmanager
def private_cluster() -> Iterator[PgCluster]:
    """A running private cluster, stopped and deleted afterwards; skips (fails in CI) when impossible."""
    cluster = _new_cluster(_server_binaries())
    with _running(cluster, cluster.init):
        yield cluster


@contextmanager
def replicated_cluster() -> Iterator[tuple[PgCluster, PgCluster]]:
    """A running private primary and a streaming replica of it, as ``private_cluster``."""
    bindir = _server_binaries()
    primary = _new_cluster(bindir)
    with _running(primary, primary.init):
        replica = _new_cluster(bindir)
        with _running(replica, lambda: replica.clone(primary)):
            yield primary, replica


def _server_binaries() -> Path:
    bindir = _pg_bin()
    if bindir is None:
        _unavailable("no server binaries under /usr/lib/postgresql")
    assert bindir is not None
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            _unavailable("running as root without runuser")
        if not _has_postgres_user():
            subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True)
    return bindir


def _new_cluster(bindir: Path) -> PgCluster:
    root = Path(tempfile.mkdtemp(prefix="memstore-pg-outage-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    return PgCluster(bindir, root, _free_port())


@contextmanager
def _running(cluster: PgCluster, create: Callable[[], None]) -> Iterator[PgCluster]:
    """``cluster`` created (``create``) and started, then stopped and deleted."""
    try:
        create()
        cluster.start()
    except (subprocess.SubprocessError, OSError) as exc:
        shutil.rmtree(cluster.root, ignore_errors=True)
        detail = getattr(exc, "stderr", None) or b""
        _unavailable(f"initdb/pg_basebackup/pg_ctl failed: {exc} {detail.decode(errors='replace').strip()}")
    try:
        yield cluster
    finally:
        with suppress(OSError, ValueError):
            cluster.thaw()
        with suppress(subprocess.SubprocessError):
            cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


def _has_postgres_user() -> bool:
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return True
