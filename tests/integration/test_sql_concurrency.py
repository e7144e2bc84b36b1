"""Concurrent writers on one scope never lose, resurrect or duplicate facts (SQLite and PostgreSQL).

Writers start from shared revisions on purpose (a barrier between load and save), so every
round after the first commit is a stale save that has to be merged.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from memstore.config import MemoryConfig
from memstore.document import create_empty_memory
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine

USER = "alice"
JOIN_TIMEOUT = 120


def _fact(fact_id: str, content: str, confidence: float = 0.8) -> dict[str, Any]:
    return {
        "id": fact_id,
        "content": content,
        "category": "context",
        "confidence": confidence,
        "createdAt": "2026-07-14T15:35:46Z",
        "source": "thread-1",
    }


def _live_contents(url: str) -> list[str]:
    """Straight from the table: what is live, including any duplicates the document might hide."""
    with get_engine(url).connect() as conn:
        rows = conn.execute(
            text(
                "SELECT f.content FROM memory_facts f JOIN memory_scopes s ON s.id = f.scope_id"
                " WHERE s.user_id = :u AND f.deleted_revision IS NULL"
            ),
            {"u": USER},
        )
        return sorted(row[0] for row in rows)


def _seed(url: str, contents: list[str]) -> None:
    doc = create_empty_memory()
    doc["facts"] = [_fact(f"fact_5eed{index:04x}", content) for index, content in enumerate(contents)]
    assert SqlMemoryStorage(url).save(doc, user_id=USER)


@pytest.fixture
def big_cap(isolated_config: MemoryConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    isolated_config.max_facts = 500
    monkeypatch.setenv("MEMSTORE_MAX_FACTS", "500")  # for spawned processes


def _round(storage: SqlMemoryStorage, writer: str, round_no: int, barrier: Any, per_round: int) -> None:
    """Load, wait for everyone to have loaded the same revision, add own facts, drop own oldest, save."""
    doc = storage.load(user_id=USER)
    barrier.wait()
    own = [fact for fact in doc["facts"] if fact["content"].startswith(f"{writer} ")]
    if own:
        doc["facts"].remove(own[0])
    for index in range(per_round):
        doc["facts"].append(
            _fact(f"fact_{writer}{round_no:02x}{index:02x}", f"{writer} r{round_no} n{index}")
        )
    if not storage.save(doc, user_id=USER, origin=writer):
        raise AssertionError(f"{writer} round {round_no}: save failed")


def _expected(writers: list[str], rounds: int, per_round: int) -> list[str]:
    """Each round a writer deletes its oldest live fact, which it always saw, then adds new ones."""
    expected: list[str] = []
    for writer in writers:
        live: list[str] = []
        for round_no in range(rounds):
            if live:
                live.pop(0)
            live.extend(f"{writer} r{round_no} n{index}" for index in range(per_round))
        expected.extend(live)
    return sorted(expected)


def _run_threads(count: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            target(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=JOIN_TIMEOUT)
    assert errors == []
    assert not any(thread.is_alive() for thread in threads)


def test_two_stale_writers_both_keep_their_changes(sql_url: str) -> None:
    _seed(sql_url, ["shared one", "shared two", "shared three"])
    first, second = SqlMemoryStorage(sql_url), SqlMemoryStorage(sql_url)
    doc_a, doc_b = first.load(user_id=USER), second.load(user_id=USER)
    assert doc_a["revision"] == doc_b["revision"] == 1

    doc_a["facts"] = [f for f in doc_a["facts"] if f["content"] != "shared one"]
    doc_a["facts"].append(_fact("fact_a0000001", "from a"))
    doc_a["user"]["workContext"] = {"summary": "a's work", "updatedAt": "2026-07-14T15:35:46Z"}
    doc_b["facts"] = [f for f in doc_b["facts"] if f["content"] != "shared two"]
    doc_b["facts"].append(_fact("fact_b0000001", "from b"))
    doc_b["history"]["recentMonths"] = {"summary": "b's months", "updatedAt": "2026-07-14T15:35:46Z"}
    assert first.save(doc_a, user_id=USER)
    assert second.save(doc_b, user_id=USER)

    for storage in (first, second, SqlMemoryStorage(sql_url)):
        loaded = storage.load(user_id=USER)
        assert sorted(f["content"] for f in loaded["facts"]) == ["from a", "from b", "shared three"]
        assert loaded["user"]["workContext"]["summary"] == "a's work"
        assert loaded["history"]["recentMonths"]["summary"] == "b's months"
        assert loaded["revision"] == 3
    assert _live_contents(sql_url) == ["from a", "from b", "shared three"]


def test_eight_threads_on_one_scope_lose_and_resurrect_nothing(sql_url: str, big_cap: None) -> None:
    _seed(sql_url, ["seed"])
    writers, rounds, per_round = [f"t{index}" for index in range(8)], 6, 2
    barriers = [threading.Barrier(len(writers)) for _ in range(rounds)]
    shared = SqlMemoryStorage(sql_url)

    def work(index: int) -> None:
        # Half the threads share one instance (and its cache); the others have their own.
        storage = shared if index % 2 else SqlMemoryStorage(sql_url)
        for round_no in range(rounds):
            _round(storage, writers[index], round_no, barriers[round_no], per_round)

    _run_threads(len(writers), work)
    expected = sorted([*_expected(writers, rounds, per_round), "seed"])
    assert _live_contents(sql_url) == expected
    assert sorted(f["content"] for f in shared.load(user_id=USER)["facts"]) == expected


def _process_writer(url: str, writer: str, rounds: int, per_round: int, barrier: Any) -> None:
    storage = SqlMemoryStorage(url)
    for round_no in range(rounds):
        _round(storage, writer, round_no, barrier, per_round)


def test_four_processes_on_one_scope_lose_and_resurrect_nothing(sql_url: str, big_cap: None) -> None:
    _seed(sql_url, ["seed"])
    writers, rounds, per_round = [f"p{index}" for index in range(4)], 5, 3
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(writers), timeout=JOIN_TIMEOUT)
    processes = [
        context.Process(target=_process_writer, args=(sql_url, writer, rounds, per_round, barrier))
        for writer in writers
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=JOIN_TIMEOUT)
    assert [process.exitcode for process in processes] == [0] * len(writers)
    assert _live_contents(sql_url) == sorted([*_expected(writers, rounds, per_round), "seed"])


def test_the_cap_holds_under_concurrent_adds(sql_url: str, isolated_config: MemoryConfig) -> None:
    isolated_config.max_facts = 10
    writers, rounds, per_round = 6, 3, 3
    barriers = [threading.Barrier(writers) for _ in range(rounds)]
    added: list[tuple[float, str]] = []
    lock = threading.Lock()

    def work(index: int) -> None:
        storage = SqlMemoryStorage(sql_url)
        for round_no in range(rounds):
            doc = storage.load(user_id=USER)
            barriers[round_no].wait()
            for n in range(per_round):
                # Distinct confidences make "the ten best" a well-defined answer.
                confidence = round(0.1 + (index * 100 + round_no * 10 + n) / 1000, 3)
                content = f"w{index} r{round_no} n{n}"
                doc["facts"].append(_fact(f"fact_{index:02x}{round_no:02x}{n:04x}", content, confidence))
                with lock:
                    added.append((confidence, content))
            assert storage.save(doc, user_id=USER)
            assert len(_live_contents(sql_url)) <= 10

    _run_threads(writers, work)
    best = sorted(content for _, content in sorted(added, reverse=True)[:10])
    assert _live_contents(sql_url) == best


def test_the_same_content_added_concurrently_is_stored_once(sql_url: str) -> None:
    _seed(sql_url, ["seed"])
    first, second = SqlMemoryStorage(sql_url), SqlMemoryStorage(sql_url)
    doc_a, doc_b = first.load(user_id=USER), second.load(user_id=USER)
    doc_a["facts"].append(_fact("fact_a0000001", "Likes green tea"))
    doc_b["facts"].append(_fact("fact_b0000001", "  likes GREEN tea "))
    assert first.save(doc_a, user_id=USER)
    assert second.save(doc_b, user_id=USER)
    assert _live_contents(sql_url) == ["Likes green tea", "seed"]


def test_racing_threads_adding_the_same_content_store_it_once(sql_url: str) -> None:
    _seed(sql_url, ["seed"])
    rounds = 5
    barriers = [threading.Barrier(4) for _ in range(rounds)]

    def work(index: int) -> None:
        storage = SqlMemoryStorage(sql_url)
        for round_no in range(rounds):
            doc = storage.load(user_id=USER)
            barriers[round_no].wait()
            doc["facts"].append(_fact(f"fact_{index:04x}{round_no:04x}", f"common fact {round_no}"))
            assert storage.save(doc, user_id=USER)

    _run_threads(4, work)
    assert _live_contents(sql_url) == sorted(["seed", *(f"common fact {n}" for n in range(rounds))])
