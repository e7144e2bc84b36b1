"""SIGKILL a writer at random points; what is left must be a state that was committed.

The writer process advances two scopes through states 1, 2, 3, ... (load, change every section
and a sliding window of facts, save) and acknowledges each save on a pipe. After each kill the
store must pass SQLite's integrity and foreign-key checks, hold no torn file, load every scope,
and each scope must equal exactly state ``k`` where ``k`` is the last acknowledged save or the
one in flight: nothing acknowledged is lost and nothing half-written shows.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memstore.document import SECTION_GROUPS, MemoryDocument
from memstore.storage.base import MemoryStorage
from memstore.storage.file import FileMemoryStorage
from memstore.storage.sql import SqlMemoryStorage
from tests.reliability.conftest import Record

KILLS = 20
WINDOW = 12
PER_STATE = 3
SCOPES: list[tuple[str, str | None]] = [("crash", None), ("crash", "bot")]


def expected_facts(k: int) -> list[str]:
    """State ``k`` holds the newest ``WINDOW`` facts of the ``k * PER_STATE`` written so far."""
    return [f"fact {n}" for n in range(max(0, k * PER_STATE - WINDOW), k * PER_STATE)]


def state_of(document: MemoryDocument) -> int:
    """Which state ``document`` is; raises when it is none (a mix of two states, or garbage)."""
    summaries = {
        document[group][name]["summary"] for group, names in SECTION_GROUPS.items() for name in names
    }
    if summaries == {""}:
        k = 0
    else:
        assert len(summaries) == 1, f"sections from different states: {summaries}"
        k = int(summaries.pop().removeprefix("state "))
    assert [f["content"] for f in document["facts"]] == expected_facts(k), f"facts are not state {k}"
    return k


def advance(document: MemoryDocument) -> tuple[MemoryDocument, int]:
    k = state_of(document) + 1
    for group, names in SECTION_GROUPS.items():
        for name in names:
            document[group][name] = {"summary": f"state {k}", "updatedAt": "2026-07-14T15:35:46Z"}
    keep = set(expected_facts(k))
    document["facts"] = [f for f in document["facts"] if f["content"] in keep]
    for n in range((k - 1) * PER_STATE, k * PER_STATE):
        document["facts"].append(
            {
                "id": f"fact_{n:08x}",
                "content": f"fact {n}",
                "category": "context",
                "confidence": 0.9,
                "createdAt": "2026-07-14T15:35:46Z",
                "source": "crash-writer",
            }
        )
    return document, k


def writer(make_storage: Callable[[], MemoryStorage], ack_fd: int) -> None:
    """Runs in the forked child until it is killed."""
    storage = make_storage()
    while True:
        for index, (user, agent) in enumerate(SCOPES):
            document, k = advance(storage.load(agent, user_id=user))
            if not storage.save(document, agent, user_id=user, origin="crash-writer"):
                os._exit(3)
            os.write(ack_fd, f"{index} {k}\n".encode())


def acknowledged(data: bytes) -> dict[int, int]:
    last: dict[int, int] = {}
    for line in data.decode().splitlines():
        index, k = line.split()
        last[int(index)] = int(k)
    return last


def sqlite_checks(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def file_checks(base: Path) -> int:
    """Every memory.json parses as a whole document; returns how many temp files a kill left behind."""
    for path in base.rglob("memory.json"):
        assert isinstance(json.loads(path.read_text(encoding="utf-8")), dict), f"torn file {path}"
    return len(list(base.rglob(".memory.*.tmp")))


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgresql", marks=pytest.mark.postgres),
        pytest.param("file", id="file"),
    ]
)
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Callable[[], MemoryStorage]]:
    if request.param == "file":
        return "file", lambda: FileMemoryStorage(tmp_path / "files")
    url = str(request.getfixturevalue(f"{request.param}_url"))
    SqlMemoryStorage(url)  # migrate before the first child forks
    return request.param, lambda: SqlMemoryStorage(url)


def test_sigkilled_writers_leave_only_committed_states(
    provider: tuple[str, Callable[[], MemoryStorage]], tmp_path: Path, record: Record
) -> None:
    kind, make_storage = provider
    rng = random.Random(20260714)
    context = multiprocessing.get_context("fork")
    progress = {index: 0 for index in range(len(SCOPES))}
    saves = leftovers = 0
    for _ in range(KILLS):
        read_fd, write_fd = os.pipe()
        child = context.Process(target=writer, args=(make_storage, write_fd), daemon=True)
        child.start()
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as acks:
            first = acks.readline()
            assert first, f"writer exited with {child.exitcode} before its first save"
            time.sleep(rng.uniform(0.0, 0.25))
            assert child.pid is not None
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
            assert child.exitcode == -signal.SIGKILL
            last = acknowledged(first + acks.read())

        if kind == "sqlite":
            sqlite_checks(tmp_path / "memory.db")
        if kind == "file":
            leftovers = file_checks(tmp_path / "files")
        storage = make_storage()
        for index, (user, agent) in enumerate(SCOPES):
            k = state_of(storage.load(agent, user_id=user))
            acked = last.get(index, progress[index])
            assert acked <= k <= acked + 1, f"scope {index}: state {k}, last acknowledged {acked}"
            saves += k - progress[index]
            progress[index] = k
    assert all(k > KILLS for k in progress.values()), f"too little progress: {progress}"
    record(provider=kind, kills=KILLS, saves=saves, torn_or_lost=0, leftover_temp_files=leftovers)
