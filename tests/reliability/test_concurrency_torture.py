"""Concurrent updaters on shared scopes, through the real queue, updater, HTTP client and stub LLM.

Worker processes and threads each own a queue and run the same users' scopes. Every
conversation tells the stub LLM one operation; the reply adds, removes (by the id the model
sees in the prompt) or re-adds that worker's own items, plus a "shared" fact every worker adds
in different spellings. Because each item has one owner, the correct final state is known
exactly, while the shared facts and the overlapping saves force the store to merge.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from memstore.config import MemoryConfig, set_memory_config
from memstore.document import fact_content_key
from memstore.queue import MemoryUpdateQueue, QueueStats
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.update.updater import MemoryUpdater
from tests.reliability.conftest import Record, configure, llm_settings
from tests.reliability.llm_script import (
    fact,
    fact_id_for,
    prompt_conversation,
    prompt_memory,
    turn,
    update_reply,
)
from tests.support.openai_server import OpenAIStubServer

SCOPES: list[tuple[str, str | None]] = [("u0", None), ("u1", None), ("u0", "coder")]
STEPS = 10
POOL = 4
PROCESSES = 2
THREADS_PER_PROCESS = 2
JOIN_TIMEOUT = 180
_OP = re.compile(r"OP (ADD|DEL) (\S+) SHARED (\S+) BY (\S+)")


def scope_label(user: str, agent: str | None) -> str:
    return f"{user}.{agent or '-'}"


def worker_ops(worker: str, scope: str) -> list[tuple[str, str]]:
    """A random but reproducible add/remove/re-add sequence over the worker's own items."""
    rng = random.Random(f"{worker}/{scope}")
    live: list[str] = []
    ops: list[tuple[str, str]] = []
    for _ in range(STEPS):
        dead = [token for n in range(POOL) if (token := f"{worker}.{scope}.i{n}") not in live]
        if live and (not dead or rng.random() < 0.45):
            token = rng.choice(live)
            live.remove(token)
            ops.append(("DEL", token))
        else:
            token = rng.choice(dead)
            live.append(token)
            ops.append(("ADD", token))
    return ops


def shared_content(scope: str, step: int, worker: str) -> str:
    """The same fact, spelled differently by different workers; dedup must keep one."""
    base = f"shared fact {scope} s{step}"
    return base.upper() if int(worker.split("w")[-1]) % 2 else f"  {base.capitalize()} "


def run_worker(worker: str) -> QueueStats:
    """One worker: its own queue and updater; one batch (all scopes) per step, flushed in order."""
    queue = MemoryUpdateQueue(MemoryUpdater)
    plans = {(user, agent): worker_ops(worker, scope_label(user, agent)) for user, agent in SCOPES}
    for step in range(STEPS):
        for (user, agent), ops in plans.items():
            kind, token = ops[step]
            queue.add(
                thread_id=f"{worker}-{scope_label(user, agent)}-{step}",
                messages=turn(f"OP {kind} {token} SHARED s{step} BY {worker}"),
                user_id=user,
                agent_name=agent,
            )
        queue.flush()
    return queue.stats


def run_threads(workers: list[str]) -> list[QueueStats]:
    results: list[QueueStats] = []
    errors: list[BaseException] = []

    def target(worker: str) -> None:
        try:
            results.append(run_worker(worker))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(worker,)) for worker in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
    if errors:
        raise errors[0]
    return results


def process_main(config_values: dict[str, Any], workers: list[str], results: Any) -> None:
    set_memory_config(MemoryConfig(**config_values))
    for stats in run_threads(workers):
        results.put(stats.__dict__)


class ScriptedModel:
    """The stub LLM's brain: one operation per conversation, ids taken from the prompt."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> str:
        match = _OP.search(prompt_conversation(body))
        if match is None:
            return self._problem("no operation in the conversation")
        kind, token, step, worker = match.groups()
        scope = token.split(".", 1)[1].rsplit(".", 1)[0]
        memory = prompt_memory(body)
        new_facts = [fact(shared_content(scope, int(step[1:]), worker))]
        removals: list[str] = []
        if kind == "ADD":
            new_facts.append(fact(f"item {token}"))
        else:
            fact_id = fact_id_for(memory, f"item {token}")
            if fact_id is None:
                return self._problem(f"{worker} cannot see its own item {token} to delete it")
            removals.append(fact_id)
        summary = {"topOfMind": {"summary": f"{worker} step {step}", "shouldUpdate": True}}
        return update_reply(new_facts, removals, user=summary)

    def _problem(self, message: str) -> str:
        with self._lock:
            self.problems.append(message)
        return update_reply()


def expected_items(workers: list[str], scope: str) -> set[str]:
    live: set[str] = set()
    for worker in workers:
        for kind, token in worker_ops(worker, scope):
            (live.add if kind == "ADD" else live.discard)(f"item {token}")
    return live


def live_rows(url: str, user: str, agent: str | None) -> list[tuple[str, str]]:
    query = text(
        "SELECT f.fact_id, f.content FROM memory_facts f JOIN memory_scopes s ON s.id = f.scope_id"
        " WHERE s.user_id = :u AND COALESCE(s.agent_name, '') = :a AND f.deleted_revision IS NULL"
    )
    with get_engine(url).connect() as conn:
        return [(row[0], row[1]) for row in conn.execute(query, {"u": user, "a": agent or ""})]


def history_rows(url: str, user: str, agent: str | None) -> list[Any]:
    query = text(
        "SELECT h.revision, h.entity_id, h.action, h.origin, h.before, h.after FROM memory_history h"
        " JOIN memory_scopes s ON s.id = h.scope_id"
        " WHERE s.user_id = :u AND COALESCE(s.agent_name, '') = :a AND h.entity = 'fact'"
        " ORDER BY h.revision, h.id"
    )
    with get_engine(url).connect() as conn:
        rows = conn.execute(query, {"u": user, "a": agent or ""})
        # A plain text() query hands SQLite's JSON back as a string.
        return [(*row[:4], *(json.loads(v) if isinstance(v, str) else v for v in row[4:])) for row in rows]


def check_history(rows: list[Any], live: dict[str, str]) -> int:
    """Replaying the audit trail must give the live facts; every row must follow from an operation."""
    state: dict[str, str] = {}
    for revision, fact_id, action, origin, before, after in rows:
        where = f"revision {revision} {action} {fact_id} by {origin}"
        if action == "insert":
            assert fact_id not in state, f"{where}: inserted while live"
            state[fact_id] = after["content"]
        elif action == "update":
            assert state.get(fact_id) == before["content"], f"{where}: update of a fact not live"
            state[fact_id] = after["content"]
        else:
            assert state.pop(fact_id, None) == before["content"], f"{where}: delete of a fact not live"
        content = (after or before)["content"]
        if content.startswith("item "):
            # Own items change only through their owner's operation on that very item.
            step_op = origin.rsplit("-", 1)[0].split("-", 1)[0]
            assert content.split(".", 1)[0] == f"item {step_op}", f"{where}: wrong owner"
        elif action != "insert":
            raise AssertionError(f"{where}: a shared fact was {action}d")
    assert state == live
    return len(rows)


@pytest.fixture
def model(openai_server: OpenAIStubServer) -> Iterator[ScriptedModel]:
    brain = ScriptedModel()
    openai_server.default_reply = brain
    yield brain


def test_workers_in_processes_and_threads_lose_resurrect_and_duplicate_nothing(
    sql_url: str, openai_server: OpenAIStubServer, model: ScriptedModel, record: Record
) -> None:
    config = configure(database_url=sql_url, **llm_settings(openai_server))
    SqlMemoryStorage(sql_url)  # migrate (SQLite) before the workers race to do it
    values = config.model_dump()
    values["llm_api_key"] = None
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process_workers = [
        [f"w{p * THREADS_PER_PROCESS + t}" for t in range(THREADS_PER_PROCESS)] for p in range(PROCESSES)
    ]
    local_workers = [f"w{PROCESSES * THREADS_PER_PROCESS + t}" for t in range(THREADS_PER_PROCESS)]
    processes = [
        context.Process(target=process_main, args=(values, workers, results)) for workers in process_workers
    ]
    for process in processes:
        process.start()
    stats = run_threads(local_workers)
    for process in processes:
        process.join(JOIN_TIMEOUT)
    assert [process.exitcode for process in processes] == [0] * PROCESSES
    stats += [QueueStats(**results.get(timeout=5)) for _ in range(PROCESSES * THREADS_PER_PROCESS)]
    workers = [w for group in process_workers for w in group] + local_workers

    assert model.problems == []
    updates = len(workers) * len(SCOPES) * STEPS
    assert sum(s.updated for s in stats) == updates
    assert sum(s.errors + s.skipped + s.abandoned for s in stats) == 0
    history_total = 0
    for user, agent in SCOPES:
        scope = scope_label(user, agent)
        rows = live_rows(sql_url, user, agent)
        contents = [content for _, content in rows]
        keys = [fact_content_key(content) for content in contents]
        assert len(keys) == len(set(keys)), f"duplicates in {scope}"
        assert len(rows) <= config.max_facts
        shared = {fact_content_key(f"shared fact {scope} s{step}") for step in range(STEPS)}
        assert {key for key in keys if key.startswith("shared")} == shared, f"shared facts lost in {scope}"
        assert {c for c in contents if c.startswith("item ")} == expected_items(workers, scope)
        loaded = SqlMemoryStorage(sql_url).load(agent, user_id=user)
        assert sorted(f["content"] for f in loaded["facts"]) == sorted(contents)
        assert re.fullmatch(r"w\d+ step s\d+", loaded["user"]["topOfMind"]["summary"])
        history_total += check_history(history_rows(sql_url, user, agent), dict(rows))
    record(
        workers=len(workers),
        processes=PROCESSES,
        updates=updates,
        llm_calls=len(openai_server.requests),
        history_rows=history_total,
        lost=0,
        resurrected=0,
        duplicates=0,
    )


def cap_confidence(worker: int, step: int, n: int) -> float:
    return round(0.7 + (worker * 100 + step * 10 + n) / 10_000, 4)


def cap_reply(body: dict[str, Any]) -> str:
    match = re.search(r"CAP w(\d+) s(\d+)", prompt_conversation(body))
    assert match is not None
    worker, step = int(match.group(1)), int(match.group(2))
    return update_reply(
        [fact(f"cap w{worker} s{step} n{n}", cap_confidence(worker, step, n)) for n in range(5)]
    )


def test_the_cap_holds_at_every_revision_under_concurrent_updaters(
    sql_url: str, openai_server: OpenAIStubServer, record: Record
) -> None:
    config = configure(database_url=sql_url, max_facts=10, **llm_settings(openai_server))
    SqlMemoryStorage(sql_url)
    openai_server.default_reply = cap_reply
    workers, steps = 4, 4

    def work(worker: int) -> None:
        queue = MemoryUpdateQueue(MemoryUpdater)
        for step in range(steps):
            queue.add(thread_id=f"w{worker}-s{step}", messages=turn(f"CAP w{worker} s{step}"), user_id="u0")
            queue.flush()
        assert queue.stats.updated == steps

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)

    added = sorted(
        (
            (cap_confidence(w, s, n), f"cap w{w} s{s} n{n}")
            for w in range(workers)
            for s in range(steps)
            for n in range(5)
        ),
        reverse=True,
    )
    best = {content for _, content in added[: config.max_facts]}
    assert {content for _, content in live_rows(sql_url, "u0", None)} == best
    live: set[str] = set()
    peak = 0
    rows = history_rows(sql_url, "u0", None)
    for index, (revision, fact_id, action, *_) in enumerate(rows):
        if action == "insert":
            live.add(fact_id)
        elif action == "delete":
            live.discard(fact_id)
        if index + 1 == len(rows) or rows[index + 1][0] != revision:  # the state each revision left
            peak = max(peak, len(live))
    assert peak <= config.max_facts
    record(workers=workers, facts_added=len(added), max_facts=config.max_facts, peak_live=peak, lost=0)
