"""``memstore worker --metrics-port`` (issue 20): a stand-alone worker's own scrape.

A real worker process runs a queued conversation through the rules extractor; its ``/metrics``,
parsed by prometheus-client's own parser, counts that extraction and shows the queue's gauges.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig, set_memory_config
from memstore.queue import DatabaseUpdateQueue
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines
from tests.integration.conftest import Cli
from tests.support.terminal import memstore_executable

DEADLINE_SECONDS = 120.0  # a loaded 2-core machine


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _samples(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    exposition = httpx.get(f"{base}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


@contextmanager
def running_worker(cli: Cli, port: int) -> Iterator[subprocess.Popen[str]]:
    env = {
        **cli.env,
        "MEMSTORE_DATABASE_URL": cli.url,  # a worker needs the gateways' database named
        "MEMSTORE_EXTRACTOR": "rules",
        "MEMSTORE_DEBOUNCE_SECONDS": "1",
    }
    process = subprocess.Popen(
        [memstore_executable(), "worker", "--workers", "1", "--metrics-port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)


def test_a_worker_serves_its_own_extractions_and_the_queue_gauges(cli: Cli) -> None:
    assert cli("db", "upgrade").returncode == 0
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    updated = ("memstore_extractions_total", (("outcome", "updated"),))
    with running_worker(cli, port) as worker:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            assert worker.poll() is None, worker.communicate()
            try:
                before = _samples(base)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the metrics port never answered"
                time.sleep(0.1)
        assert before.get(updated, 0.0) == 0.0  # a labelled series appears with its first count
        assert ("memstore_queue_pending", ()) in before and ("memstore_queue_dead", ()) in before
        assert httpx.get(f"{base}/other").status_code == 404

        set_memory_config(MemoryConfig(database_url=cli.url, extractor="rules", queue_workers=0))
        producer = DatabaseUpdateQueue(cli.url, workers=0)
        turn = [
            {"role": "user", "content": "I work at Acme Robotics."},
            {"role": "assistant", "content": "Ok."},
        ]
        producer.submit(ConversationContext("t1", turn, None, "alice"), immediately=True)
        producer.shutdown(5)

        while _samples(base).get(updated, 0.0) < 1.0:
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the worker never counted the extraction"
            time.sleep(0.2)
        after = _samples(base)
        assert after[("memstore_queue_pending", ())] == 0.0
        assert after[("memstore_storage_operations_total", (("operation", "save"), ("outcome", "ok")))] >= 1.0
        exposition = httpx.get(f"{base}/metrics").text
        assert "alice" not in exposition and "Acme" not in exposition  # no user, no content
    assert worker.returncode == 0
    try:
        [fact] = SqlMemoryStorage(cli.url).load(user_id="alice")["facts"]
        assert "Acme Robotics" in fact["content"]
    finally:
        dispose_engines()


def test_a_busy_metrics_port_is_exit_5(cli: Cli) -> None:
    cli.env["MEMSTORE_DATABASE_URL"] = cli.url
    assert cli("db", "upgrade").returncode == 0  # past the worker's setup checks
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("worker", "--metrics-port", str(port))
    assert result.returncode == 5 and f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_render_metrics_needs_no_fastapi(tmp_path: Path) -> None:
    """Gateways on other frameworks, and the worker, serve the scrape without the server extra."""
    script = (
        "import sys\n"
        "sys.modules['fastapi'] = None  # any import of it now fails\n"
        "from memstore.integrations.metrics import render_metrics\n"
        "body, content_type = render_metrics()\n"
        "print(content_type.split(';')[0], b'memstore_queue_pending' in body)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_DATA_DIR"] = str(tmp_path / "data")
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "text/plain True\n"
