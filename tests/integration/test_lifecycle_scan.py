"""The lifecycle run at scale (issue 37 item 5): the batched scan, short removals, the progress bar.

The SQL provider's run reads facts straight from the table (``storage.sql.maintenance.lifecycle``);
these tests hold it to what a fresh read of each scope's document gives, and hold a real run to
its promise: a removal at most ``batch_facts`` facts per transaction, each after a fresh read and
score of the scope, so a writer between two batches is neither blocked nor overwritten. Every
test runs on a real SQLite file and a real PostgreSQL database; the CLI test on a terminal.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from memstore.config import MemoryConfig
from memstore.document import create_empty_memory, format_timestamp
from memstore.ops.lifecycle import LIFECYCLE_ORIGIN, read_scope, run_lifecycle
from memstore.retention import ScopeFacts
from memstore.storage.sql.documents.provider import SqlMemoryStorage
from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.maintenance.lifecycle import LiveFactScan
from tests.support.terminal import memstore_executable, run_on_terminal

NOW = datetime.now(UTC).replace(microsecond=0)


def _fact(number: int, confidence: object = 0.9, *, age_days: float = 400, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"fact_{number:08x}",
        "content": extra.pop("content", f"fact number {number}"),
        "category": extra.pop("category", "knowledge"),
        "confidence": confidence,
        "createdAt": format_timestamp(NOW - timedelta(days=age_days)),
        **extra,
    }


def _save(
    storage: SqlMemoryStorage, facts: list[dict[str, Any]], agent: str | None = None, **scope: Any
) -> None:
    document = create_empty_memory()
    document["facts"] = facts
    assert storage.save(document, agent, **scope)


def _odd_facts() -> list[dict[str, Any]]:
    """Facts whose document form the columns alone do not give back (the codec's raw values)."""
    return [
        _fact(1, createdAt="2026-07-14"),  # a date without a time
        _fact(2, createdAt="2025-01-02T03:04:05+08:00"),  # an offset
        _fact(3, createdAt="9999-01-01T00:00:00Z"),  # in the future: never confirmed
        {"id": "fact_00000004", "content": "no date, no confidence, no category"},
        _fact(5, category="  correction  "),  # protected once stripped
        _fact(6, category=""),
        _fact(7, category="c" * 70),  # longer than the column keeps
        _fact(8, 1),  # an integer confidence
        _fact(9, "sure"),
        _fact(10, 1.5),
        _fact(11, importance=0.1234567),  # finer than the column's six decimals
        _fact(12, importance=0.9),
        _fact(13, importance="high"),
        _fact(14, mood="calm", note='"$memstore"'),  # unknown keys, one that looks reserved
        _fact(15, age_days=3, content="user lives in Lyon"),
    ]


def _document_path(storage: SqlMemoryStorage, user_id: str | None) -> list[ScopeFacts]:
    return [read_scope(storage, user, agent)[1] for user, agent in storage.list_scopes(user_id)]


def test_the_scan_reads_each_fact_as_a_fresh_document_does(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    storage = SqlMemoryStorage(sql_url)
    _save(storage, _odd_facts(), user_id="alice")
    _save(storage, [_fact(20), _fact(21, age_days=1)], "coder", user_id="alice")
    _save(storage, [_fact(30)])  # the legacy global scope: no user, no agent
    _save(storage, [_fact(40)], "researcher")  # an agent's own scope
    _save(storage, [_fact(50), _fact(51)], user_id="bob")
    with get_engine(sql_url).begin() as conn:
        conn.execute(
            text(
                "UPDATE memory_facts SET access_count = 4, last_accessed_at = :at, last_confirmed_at = :at "
                "WHERE fact_id IN ('fact_0000000b', 'fact_00000014')"
            ),
            {"at": NOW - timedelta(days=2)},
        )
    document = storage.reload(user_id="bob")
    document["facts"] = document["facts"][:1]  # fact_00000033 becomes a tombstone
    assert storage.save(document, user_id="bob")

    for user in (None, "alice", "bob"):
        scan = LiveFactScan(storage.engine, storage.identity, user, batch_facts=2)
        scanned = [scope for batch in scan for scope in batch]
        assert scanned == _document_path(storage, user), user
        assert scan.scopes == len(scanned) and scan.total == sum(len(s.candidates) for s in scanned)
    everyone = [
        scope
        for batch in LiveFactScan(storage.engine, storage.identity, None, batch_facts=2)
        for scope in batch
    ]
    assert [(scope.user_id, scope.agent_name) for scope in everyone] == [
        (None, None),
        (None, "researcher"),
        ("alice", None),
        ("alice", "coder"),
        ("bob", None),
    ]


def test_a_dry_run_scores_in_batches_and_reports_its_progress(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    storage = SqlMemoryStorage(sql_url)
    for user in range(5):
        _save(storage, [_fact(10 * user + n, age_days=400 * (n % 2)) for n in range(3)], user_id=f"u{user}")
    calls: list[tuple[int, int]] = []
    report = run_lifecycle(
        dry_run=True,
        now=NOW,
        storage=storage,
        threshold=0.5,
        batch_facts=4,
        progress=lambda *c: calls.append(c),
    )
    assert calls[0] == (0, 15) and calls[-1] == (15, 15)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls) and len(calls) == 6  # 5 batches
    assert report.live_facts == 15 and report.scopes_scanned == 5
    assert len(report.expiring) == 5  # the one old fact of each scope's three
    whole = run_lifecycle(dry_run=True, now=NOW, storage=storage, threshold=0.5)
    assert [fact.to_json() for fact in whole.expiring] == [fact.to_json() for fact in report.expiring]


def _deletions_by_revision(url: str) -> list[int]:
    with get_engine(url).connect() as conn:
        rows = conn.execute(
            text(
                "SELECT revision, count(*) AS n, min(origin) AS origin FROM memory_history "
                "WHERE action = 'delete' AND entity = 'fact' GROUP BY scope_id, revision "
                "ORDER BY scope_id, revision"
            )
        ).all()
    assert {row.origin for row in rows} <= {LIFECYCLE_ORIGIN}
    return [int(row.n) for row in rows]


def test_a_real_run_removes_at_most_a_batch_per_transaction(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    storage = SqlMemoryStorage(sql_url)
    _save(storage, [*(_fact(n) for n in range(7)), _fact(9, age_days=1)], user_id="alice")
    _save(storage, [_fact(20)], user_id="bob")
    report = run_lifecycle(dry_run=False, now=NOW, storage=storage, threshold=0.5, batch_facts=3)
    assert report.removed == 8 and len(report.expiring) == 8
    assert _deletions_by_revision(sql_url) == [3, 3, 1, 1]  # alice's seven in three saves, bob's one
    assert [fact["id"] for fact in storage.reload(user_id="alice")["facts"]] == ["fact_00000009"]


def test_a_writer_between_batches_is_not_blocked_and_its_changes_stand(
    sql_url: str, isolated_config: MemoryConfig
) -> None:
    """After alice's removal, another process uses one of bob's expiring facts and adds facts to
    both scopes. Bob's scope was scanned before that (one batch), yet the run re-reads and
    re-scores it before removing: the used fact stays, and nothing the writer saved is lost."""
    storage = SqlMemoryStorage(sql_url)
    _save(storage, [_fact(1), _fact(2)], user_id="alice")
    _save(storage, [_fact(11), _fact(12), _fact(13)], user_id="bob")
    errors: list[BaseException] = []

    def write() -> None:
        try:
            other = SqlMemoryStorage(sql_url)
            for _ in range(8):  # eight recent uses saturate the heat: decay 0.9, over 0.5
                other.record_access(None, user_id="bob", fact_ids=["fact_0000000c"])
            assert other.flush_access() == 1
            for user, number in (("alice", 3), ("bob", 14)):
                document = other.load(user_id=user)
                document["facts"].append(_fact(number, age_days=0, content=f"new fact of {user}"))
                assert other.save(document, user_id=user)
        except BaseException as exc:  # reported to the test's thread
            errors.append(exc)

    def progress(done: int, total: int) -> None:
        if done == 2 and not errors:  # alice removed, bob not yet: run a writer meanwhile
            writer = threading.Thread(target=write)
            writer.start()
            writer.join(120)
            assert not writer.is_alive(), "the writer waited on the run's transaction"

    report = run_lifecycle(
        dry_run=False, now=NOW, storage=storage, threshold=0.5, batch_facts=100, progress=progress
    )
    assert not errors, errors
    assert report.removed == 4
    assert {fact.fact_id for fact in report.expiring} == {
        "fact_00000001",
        "fact_00000002",
        "fact_0000000b",
        "fact_0000000d",
    }
    assert [fact["id"] for fact in storage.reload(user_id="alice")["facts"]] == ["fact_00000003"]
    assert [fact["id"] for fact in storage.reload(user_id="bob")["facts"]] == [
        "fact_0000000c",
        "fact_0000000e",
    ]


def test_the_cli_shows_a_bar_on_a_terminal_only(tmp_path: Path, isolated_config: MemoryConfig) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_") and k != "NO_COLOR"}
    env["MEMSTORE_DATA_DIR"] = str(tmp_path / "data")
    env["TERM"] = "xterm-256color"
    url = f"sqlite:///{tmp_path / 'data' / 'memory.db'}"
    assert (
        subprocess.run([memstore_executable(), "db", "upgrade"], env=env, capture_output=True).returncode == 0
    )
    try:
        storage = SqlMemoryStorage(url)
        _save(storage, [_fact(1), _fact(2, age_days=1)], user_id="alice")
        _save(storage, [_fact(3)], user_id="bob")
    finally:
        dispose_engines()
    args = ("lifecycle", "run", "--dry-run", "--below", "0.5")
    code, stdout, terminal = run_on_terminal(env, *args)
    assert code == 0 and "would remove 2 fact(s)" in stdout
    assert "Scoring facts" in terminal and "3/3" in terminal
    code, stdout, terminal = run_on_terminal(env, *args, "--json")
    assert code == 0 and "Scoring facts" not in terminal
    assert json.loads(stdout)["expiring_count"] == 2
    piped = subprocess.run([memstore_executable(), *args], env=env, capture_output=True, text=True)
    assert piped.returncode == 0 and piped.stderr == ""
