"""Configuration and startup (issue 30, items 7-10, 19 and 22), through the real console entry point.

Each case is what a new user met: a settings file that was silently ignored, a worker that
claimed rows it could only fail or idled on a SQLite file it had just created, an LLM endpoint
without a model that ``doctor`` called ok, a schema error reported as an outage, and a normal
shutdown logged as a warning.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from memstore.cli.exit_codes import EXIT_DOCTOR_FAILED
from memstore.config import FILE_STORAGE_CLASS
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.table import QueuedConversation
from memstore.storage.sql.schema import migrate
from memstore.storage.sql.schema.models import queue_table as queue_rows
from tests.integration.conftest import Cli
from tests.integration.test_integrations_docs import examples
from tests.support.openai_server import OpenAIStubServer
from tests.support.terminal import memstore_executable

MODEL_NAME_MISSING = (
    "model_name is not set: configure memory.model_name (or MEMSTORE_MODEL_NAME) to use the LLM extractor"
)
NO_FILE = "the SQLite file does not exist (check the path; `memstore db upgrade` creates it)"


def _sqlite_cli(tmp_path: Path) -> Cli:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_DATA_DIR"] = str(tmp_path / "data")
    return Cli(env, f"sqlite:///{tmp_path / 'data' / 'memory.db'}")


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith("Error: ")
    return line.removeprefix("Error: ")


# --- item 7: a settings file without a memory: section ---------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("database_url: sqlite:///x.db\n", "database_url"),
        ("memstore:\n  database_url: sqlite:///x.db\n", "memstore"),
    ],
)
def test_a_settings_file_without_a_memory_section_is_an_error_naming_the_key(
    tmp_path: Path, text: str, key: str
) -> None:
    settings = tmp_path / "memstore.yaml"
    settings.write_text(text, encoding="utf-8")
    cli = _sqlite_cli(tmp_path)
    for args in (["config", "show"], ["doctor"], ["stats"]):
        message = _one_error_line(cli(*args, "--config", str(settings)))
        assert message.startswith(f"memory config file {settings}: unknown top-level key '{key}'"), message
    assert not (tmp_path / "data").exists()  # nothing ran on the defaults


# --- item 8: an LLM endpoint without model_name ----------------------------------------------------


def test_doctor_fails_an_llm_endpoint_without_model_name(cli: Cli, openai_server: OpenAIStubServer) -> None:
    """The endpoint answers, so doctor said ok; every update then failed until the row was dead."""
    assert cli("db", "upgrade").returncode == 0
    cli.env["MEMSTORE_LLM_BASE_URL"] = openai_server.base_url
    result = cli("doctor", "--json")
    assert result.returncode == EXIT_DOCTOR_FAILED, result.stderr
    found = {f["part"]: (f["verdict"], f["detail"]) for f in json.loads(result.stdout)}
    assert found["llm"] == ("fail", f"{openai_server.base_url}: {MODEL_NAME_MISSING}")
    assert found["database"][0] == "ok"
    cli.env["MEMSTORE_MODEL_NAME"] = "test-model"
    result = cli("doctor", "--json")
    assert result.returncode == 0, result.stdout
    assert {f["part"]: f["verdict"] for f in json.loads(result.stdout)}["llm"] == "ok"


# --- item 9: the worker checks its configuration at start ------------------------------------------


def _queue_one(url: str) -> None:
    turn = [{"role": "user", "content": "I work at Acme."}, {"role": "assistant", "content": "Noted."}]
    now = datetime.now(UTC)
    with get_engine(url).begin() as conn:
        queue_table.enqueue(
            conn,
            QueuedConversation("t", "alice", None, turn, False, False, now),
            owner="gateway",
            now=now,
            due_at=now,
            latest_due_at=now,
        )


def _rows(url: str) -> list[tuple[str, int]]:
    try:
        with get_engine(url).connect() as conn:
            return [
                (str(state), int(attempts))
                for state, attempts in conn.execute(select(queue_rows.c.state, queue_rows.c.attempts))
            ]
    finally:
        dispose_engines()


def test_the_worker_refuses_a_setup_that_cannot_work_before_it_claims_anything(cli: Cli) -> None:
    assert cli("db", "upgrade").returncode == 0
    _queue_one(cli.url)
    with_url = {"MEMSTORE_DATABASE_URL": cli.url, "MEMSTORE_DEBOUNCE_SECONDS": "1"}
    cases = {
        # It claimed this row and failed it 3 times in 10 s: the updater saves through the file provider.
        "file provider": (
            {**with_url, "MEMSTORE_STORAGE_CLASS": FILE_STORAGE_CLASS},
            "the durable queue lives in the SQL provider's database; "
            f"storage_class is {FILE_STORAGE_CLASS}: there is no queue for a worker to run",
        ),
        # Each update would fail with this until the row went dead.
        "no model": ({**with_url, "MEMSTORE_LLM_BASE_URL": "http://127.0.0.1:9/v1"}, MODEL_NAME_MISSING),
    }
    for name, (settings, expected) in cases.items():
        env = {k: v for k, v in cli.env.items() if k != "MEMSTORE_DATABASE_URL"} | settings
        started = time.monotonic()
        result = subprocess.run(
            [memstore_executable(), "worker", "--workers", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,  # it used to run on, failing the row
        )
        assert _one_error_line(result) == expected, name
        assert time.monotonic() - started < 30, name
    assert _rows(cli.url) == [("pending", 0)]  # never claimed


def test_the_worker_needs_the_gateways_database_and_creates_none(tmp_path: Path) -> None:
    cli = _sqlite_cli(tmp_path)
    default = Path(tmp_path / "data" / "memory.db")
    message = _one_error_line(cli("worker"))
    assert message == (
        "database_url is not set: a worker runs the queue of the gateways' database; set "
        f"MEMSTORE_DATABASE_URL (the embedded file here would be sqlite:///{default})"
    )
    typo = f"sqlite:///{tmp_path / 'typo' / 'memory.db'}"
    cli.env["MEMSTORE_DATABASE_URL"] = typo
    message = _one_error_line(cli("worker"))
    assert message == f"no database at {typo}: {NO_FILE}"
    assert not default.exists() and not (tmp_path / "typo").exists()


@pytest.mark.postgres
def test_the_worker_refuses_a_schema_behind_head(pg_url: str, tmp_path: Path) -> None:
    cli = _sqlite_cli(tmp_path)
    cli.env["MEMSTORE_DATABASE_URL"] = pg_url
    message = _one_error_line(cli("worker"))
    assert message.endswith(
        f"is at revision <base> (empty), head is {migrate.head()}: "
        "run `memstore db upgrade` (or set auto_migrate: true)"
    )


# --- item 22: a normal SIGTERM is news, not a warning ----------------------------------------------


def test_a_sigterm_is_logged_at_info(cli: Cli) -> None:
    assert cli("db", "upgrade").returncode == 0
    env = {**cli.env, "MEMSTORE_DATABASE_URL": cli.url}
    for verbose in (["-v"], []):
        process = subprocess.Popen(
            [memstore_executable(), "worker", "--workers", "1", *verbose],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stderr is not None
        started = process.stderr.readline()  # written once the worker runs
        assert started.startswith("memstore worker: 1 worker(s) on "), started
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=60)
        assert process.returncode == 0, rest
        assert "WARNING" not in rest, rest
        expected = ["memstore worker: stopped (0 updated)"]
        if verbose:
            expected.insert(0, "INFO memstore.cli.queue: memstore worker: SIGTERM received, shutting down")
        assert [line for line in rest.splitlines() if "memstore.queue" not in line] == expected


def test_serve_logs_a_sigterm_at_info_too(cli: Cli) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [memstore_executable(), "serve", "--user", "alice", "--port", str(port)],
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.communicate()
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "memstore serve never answered"
                time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    # uvicorn re-raises the signal once it has shut down cleanly, so the exit status says SIGTERM.
    assert process.returncode in (0, -signal.SIGTERM), stderr
    assert "INFO:     Shutting down" in stderr and "WARNING" not in stderr, stderr


# --- item 19: doctor's skipped lines, db current on a missing file ---------------------------------


def test_doctor_prints_schema_and_queue_as_skip_when_the_database_check_fails(tmp_path: Path) -> None:
    cli = _sqlite_cli(tmp_path)
    cli.env["MEMSTORE_DATABASE_URL"] = "postgresql://memstore@127.0.0.1:1/memstore"
    result = cli("doctor")
    assert result.returncode == EXIT_DOCTOR_FAILED
    lines = result.stdout.splitlines()
    parts = [line.split()[1] for line in lines]
    assert parts == ["settings", "database", "schema", "queue", "llm", "embeddings", "tokens"]
    assert lines[1].startswith("fail  database    cannot reach postgresql://memstore@127.0.0.1:1/memstore")
    assert lines[2:4] == [
        "skip  schema      the database check failed",
        "skip  queue       the database check failed",
    ]
    cli.env["MEMSTORE_STORAGE_CLASS"] = FILE_STORAGE_CLASS
    found = {f["part"]: (f["verdict"], f["detail"]) for f in json.loads(cli("doctor", "--json").stdout)}
    assert found["schema"] == found["queue"] == ("skip", "no database")


def test_db_current_on_a_missing_sqlite_file_says_so(tmp_path: Path) -> None:
    cli = _sqlite_cli(tmp_path)
    message = _one_error_line(cli("db", "current"))
    assert message == f"no database at {cli.url}: {NO_FILE}"
    assert not (tmp_path / "data").exists()
    assert cli("db", "upgrade").returncode == 0
    assert cli("db", "current").stdout.endswith(" (head)\n")


# --- item 10: the plain-Python example against an unmigrated PostgreSQL ----------------------------


@pytest.mark.postgres
def test_the_plain_python_example_fails_fast_on_an_unmigrated_database(pg_url: str, tmp_path: Path) -> None:
    code, _ = examples()[0]
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_") and k != "OPENAI_API_KEY"}
    env["MEMSTORE_DATABASE_URL"] = pg_url
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert time.monotonic() - started < 60
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("Traceback") == 1
    last = result.stderr.splitlines()[-1]
    assert (
        last.startswith("memstore.errors.SchemaNotReadyError: database ")
        and "run `memstore db upgrade`" in last
    )
    for wrong in ("cannot reach", "unreachable", "lost", "continuing without memory"):
        assert wrong not in result.stderr
