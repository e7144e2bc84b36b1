"""Two gateway processes × 4 workers share one queue: no scope is ever processed twice at once.

200 conversations over 20 scopes (10 users, each with and without an agent), queued by both
processes at once, so every scope has conversations from both. Each process logs every
update's interval on the machine's monotonic clock, up to its save's commit (which also gives
the scope's claim back); two intervals of one scope must never overlap. Afterwards every fact
is present, each conversation was applied once, and nothing ran again once done.
"""

from __future__ import annotations

import itertools
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

from memstore.storage.sql import SqlMemoryStorage
from tests.reliability.conftest import Record
from tests.reliability.queue_support import (
    Conversation,
    Scope,
    audit_counts,
    conversation,
    expected_facts,
    gateway,
    llm_config,
    lost_facts,
    queue_rows,
    token_reply,
    wait_queued,
)
from tests.support.openai_server import OpenAIStubServer
from tests.support.queue_gateway import UpdateRecord, read_records

SCOPES: list[Scope] = [(f"s{user}", agent) for user in range(10) for agent in (None, "bot")]
PER_SCOPE_PER_PROCESS = 5
WORKERS = 4


def _conversations(process: str) -> list[Conversation]:
    return [
        conversation(str(user), agent, f"{user}-{agent or 'none'}-{process}{k}")
        for k in range(PER_SCOPE_PER_PROCESS)
        for user, agent in SCOPES
    ]


def _overlaps(records: list[UpdateRecord]) -> list[tuple[UpdateRecord, UpdateRecord]]:
    by_scope: dict[Scope, list[UpdateRecord]] = defaultdict(list)
    for entry in records:
        by_scope[entry.scope].append(entry)
    overlaps = []
    for intervals in by_scope.values():
        intervals.sort(key=lambda entry: entry.start)
        overlaps += [(a, b) for a, b in itertools.pairwise(intervals) if b.start < a.end]
    return overlaps


def _peak_concurrency(records: list[UpdateRecord]) -> int:
    events = sorted([(entry.start, 1) for entry in records] + [(entry.end, -1) for entry in records])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_two_processes_never_process_one_scope_concurrently(
    sql_url: str, openai_server: OpenAIStubServer, tmp_path: Path, record: Record
) -> None:
    SqlMemoryStorage(sql_url)  # migrated before the gateways start
    openai_server.default_reply = token_reply
    openai_server.delay = 0.05
    settings = llm_config(openai_server, database_url=sql_url, queue_poll_seconds=0.2)
    first, second = _conversations("a"), _conversations("b")
    everything = first + second

    started = time.monotonic()
    with (
        gateway(tmp_path, "a", settings, first, workers=WORKERS, pace=0.005) as one,
        gateway(tmp_path, "b", settings, second, workers=WORKERS, pace=0.005) as other,
    ):
        wait_queued(one)
        wait_queued(other)
        deadline = time.monotonic() + 90
        while queue_rows(sql_url)["done"] < len(everything):
            assert time.monotonic() < deadline, f"queue did not drain: {queue_rows(sql_url)}"
            assert one.poll() is None and other.poll() is None, "a gateway died"
            time.sleep(0.1)
        drained = time.monotonic() - started
        for process in (one, other):
            process.send_signal(signal.SIGTERM)
        assert (one.wait(20), other.wait(20)) == (0, 0)

    records = read_records(tmp_path / "updates")
    overlaps = _overlaps(records)
    assert overlaps == [], f"{len(overlaps)} overlapping interval(s) of one scope, e.g. {overlaps[0]}"
    pids_per_scope = {scope: {e.pid for e in records if e.scope == scope} for scope in SCOPES}
    assert len({e.pid for e in records}) == 2, "one process did all the work: nothing was contended"
    peak = _peak_concurrency(records)
    assert peak > 2, f"at most {peak} update(s) ran at once: the workers never ran in parallel"

    lost = lost_facts(sql_url, everything)
    assert lost == []
    runs = Counter(e.thread_id for e in records if e.outcome == "saved")
    assert set(runs.values()) == {1} and len(runs) == len(everything), "a conversation ran twice"
    inserted, rewrites = audit_counts(sql_url)
    assert set(inserted.values()) == {1} and len(inserted) == len(everything)
    assert rewrites == dict.fromkeys(expected_facts(everything), 2 * PER_SCOPE_PER_PROCESS)
    assert queue_rows(sql_url) == {"done": len(everything), "claims": 0}
    record(
        conversations=len(everything),
        scopes=len(SCOPES),
        processes=2,
        workers_per_process=WORKERS,
        updates_logged=len(records),
        scopes_run_by_both_processes=sum(len(pids) == 2 for pids in pids_per_scope.values()),
        peak_concurrent_updates=peak,
        drain_s=round(drained, 1),
        mean_update_ms=round(1000 * sum(e.end - e.start for e in records) / len(records)),
        overlapping_intervals=len(overlaps),
        lost=len(lost),
        applied_twice=0,
    )
