"""Agent documents edited from several OS processes at once, on one SQLite file and one
PostgreSQL database (issue 34's acceptance: one wins, the other gets a conflict, nothing is lost).

Each worker is a spawned process with its own engine and pool, as a replica is. A barrier
releases them together after each has read the same version; the database alone decides who
wins. The loser is told (``AgentDocConflictError``) and redoes its change on the version it reads
again, so every change ends up in the document and in the history, one version each.
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from memstore.agent_doc import MAIN_DOC_PATH, DocScope
from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import AgentDocConflictError, AgentDocLimitError
from memstore.ops import agent_docs as ops
from memstore.queries import erase_user
from memstore.storage.sql.schema.models import agent_document_versions_table, agent_documents_table

JOIN_TIMEOUT = 120
SCOPE = DocScope("coder", None, "acme")
WORKERS = ("left", "right")
TRIALS = 3
Outcome = tuple[Any, ...]


def _configure(url: str, **settings: Any) -> None:
    set_memory_config(MemoryConfig(database_url=url, agent_doc_history_keep=1000, **settings))
    ops.reset_agent_doc_stores()


def _line(name: str, value: str) -> str:
    return f"- {name}: {value}\n"


def _change(name: str, action: str, live: str, trial: int) -> tuple[str, str | None]:
    """The worker's change to ``live``: an edit of its own line, or the whole text with its line
    rewritten (what an agent does with write_file). Returns (new text or old string, new string)."""
    line = next(text for text in live.splitlines(keepends=True) if text.startswith(f"- {name}:"))
    mine = _line(name, f"{action} {trial}")
    if action == "edit":
        return line, mine
    return live.replace(line, mine), None


def _attempt(name: str, action: str, trial: int, version: int, live: str) -> Any:
    old_or_text, new = _change(name, action, live, trial)
    if action == "edit":
        return ops.edit_doc(
            SCOPE, MAIN_DOC_PATH, old_or_text, new, expected_version=version, author="agent", actor=name
        )
    return ops.write_doc(
        SCOPE, MAIN_DOC_PATH, old_or_text, expected_version=version, author="agent", actor=name
    )


def _racer(url: str, name: str, actions: list[str], barrier: Any, results: Any) -> None:
    """Per trial: read, wait for the other, write over the version read; on a conflict, read
    again and redo the change there."""
    _configure(url)
    for trial, action in enumerate(actions):
        barrier.wait()
        read = ops.read_doc(SCOPE, MAIN_DOC_PATH)
        barrier.wait()
        try:
            won = _attempt(name, action, trial, read.version, read.content or "")
            results.put((trial, name, "won", read.version, won.version))
        except AgentDocConflictError as exc:
            results.put((trial, name, "conflict", exc.expected, exc.current))
            again = ops.read_doc(SCOPE, MAIN_DOC_PATH)
            _attempt(name, action, trial, again.version, again.content or "")


def _run(target: Any, argument_lists: list[tuple[Any, ...]]) -> list[Outcome]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(argument_lists), timeout=JOIN_TIMEOUT)
    results = context.Queue()
    processes = [context.Process(target=target, args=(*args, barrier, results)) for args in argument_lists]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=JOIN_TIMEOUT)
    assert [process.exitcode for process in processes] == [0] * len(processes)
    outcomes: list[Outcome] = []
    while True:
        try:
            outcomes.append(results.get(timeout=1))
        except queue.Empty:
            return outcomes


def test_two_processes_writing_over_the_same_version_one_wins_the_other_conflicts(sql_url: str) -> None:
    _configure(sql_url)
    start = "".join(_line(name, "start") for name in WORKERS)
    ops.write_doc(SCOPE, MAIN_DOC_PATH, start, expected_version=0, author="operator")
    actions = ["edit", "write"] * TRIALS
    outcomes = _run(_racer, [(sql_url, name, actions) for name in WORKERS])

    history = {v.version: v for v in ops.doc_history(SCOPE, MAIN_DOC_PATH, limit=100)}
    assert sorted(history) == list(range(1, 2 + 2 * len(actions)))  # the start, then two per trial
    values = dict.fromkeys(WORKERS, "start")
    for trial, action in enumerate(actions):
        base = 1 + 2 * trial  # both read this version
        mine = sorted((o for o in outcomes if o[0] == trial), key=lambda o: o[2], reverse=True)
        (_, winner, won, read, stored), (_, loser, lost, wanted, current) = mine
        assert (won, read, stored) == ("won", base, base + 1), outcomes
        assert (lost, wanted, current) == ("conflict", base, base + 1), outcomes
        # The winner's change is the next version, the loser's redo the one after: none lost.
        for version, name in ((base + 1, winner), (base + 2, loser)):
            values[name] = f"{action} {trial}"
            assert (history[version].actor, history[version].action) == (name, action)
            assert history[version].content == "".join(_line(n, values[n]) for n in WORKERS)
    final = ops.read_doc(SCOPE, MAIN_DOC_PATH)
    assert (final.version, final.content) == (1 + 2 * len(actions), history[final.version].content)


def _blind_editor(url: str, name: str, rounds: int, barrier: Any, results: Any) -> None:
    """Edits without a version: each replaces a line of its own, at the same moment as the other."""
    _configure(url)
    for round_no in range(rounds):
        barrier.wait()
        old = _line(name, "start" if round_no == 0 else f"round {round_no - 1}")
        doc = ops.edit_doc(
            SCOPE, MAIN_DOC_PATH, old, _line(name, f"round {round_no}"), expected_version=None, author="agent"
        )
        results.put((round_no, name, doc.version))


def test_edits_without_a_version_from_two_processes_both_apply(sql_url: str) -> None:
    _configure(sql_url)
    start = "# Notes\n" + "".join(_line(name, "start") for name in WORKERS)
    ops.write_doc(SCOPE, MAIN_DOC_PATH, start, expected_version=0, author="operator")
    rounds = 4
    outcomes = _run(_blind_editor, [(sql_url, name, rounds) for name in WORKERS])
    assert len(outcomes) == rounds * len(WORKERS)
    # Each edit is a version of its own, none applied over a text that lacked the other's edit.
    assert sorted(o[2] for o in outcomes) == list(range(2, 2 + rounds * len(WORKERS)))
    final = ops.read_doc(SCOPE, MAIN_DOC_PATH)
    assert final.content == "# Notes\n" + "".join(_line(name, f"round {rounds - 1}") for name in WORKERS)
    assert len(ops.doc_history(SCOPE, MAIN_DOC_PATH, limit=100)) == 1 + rounds * len(WORKERS)


def _creator(url: str, index: int, max_docs: int, barrier: Any, results: Any) -> None:
    _configure(url, agent_doc_max_docs=max_docs)
    barrier.wait()
    try:
        ops.write_doc(SCOPE, f"/memories/p{index}.md", f"doc {index}", expected_version=0, author="agent")
        results.put((index, "created"))
    except AgentDocLimitError:
        results.put((index, "refused"))


def test_concurrent_creators_of_different_documents_cannot_pass_the_cap(sql_url: str) -> None:
    max_docs, creators = 3, 6
    _configure(sql_url, agent_doc_max_docs=max_docs)
    ops.write_doc(SCOPE, MAIN_DOC_PATH, "main", expected_version=0, author="operator")
    outcomes = _run(_creator, [(sql_url, index, max_docs) for index in range(creators)])
    created = sorted(index for index, outcome in outcomes if outcome == "created")
    assert len(outcomes) == creators and len(created) == max_docs - 1
    assert [doc.path for doc in ops.list_docs(SCOPE)] == sorted(
        [MAIN_DOC_PATH, *(f"/memories/p{index}.md" for index in created)]
    )


# --- erases racing a write (threads: the write is held open inside its transaction) ---------------


def _held_write(scope: DocScope, actor: str, entered: threading.Event, release: threading.Event) -> None:
    """Edits ``scope``'s main document as ``actor``, waiting inside the transaction (its locks
    taken, nothing written yet) until ``release``."""

    def change(live: str | None) -> str:
        entered.set()
        assert release.wait(JOIN_TIMEOUT)
        return f"{live}written while an erase ran\n"

    ops.get_agent_doc_store().change(
        scope,
        MAIN_DOC_PATH,
        change,
        action="edit",
        expected_version=None,
        author="agent",
        actor=actor,
        limits=ops.doc_limits(),
        now=datetime.now(UTC),
    )


def _race_erase(scope: DocScope, actor: str, erase: Callable[[], object]) -> None:
    ops.write_doc(scope, MAIN_DOC_PATH, "before\n", expected_version=0, author="agent", actor=actor)
    entered, release = threading.Event(), threading.Event()
    writer = threading.Thread(target=_held_write, args=(scope, actor, entered, release))
    writer.start()
    try:
        assert entered.wait(JOIN_TIMEOUT)
        eraser = threading.Thread(target=erase)
        eraser.start()
        time.sleep(1.0)  # the erase gets as far as it can while the write is open
    finally:
        release.set()
    writer.join(JOIN_TIMEOUT)
    eraser.join(JOIN_TIMEOUT)
    assert not writer.is_alive() and not eraser.is_alive()


def _rows(url: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [
                (table.name, row.tenant_id, row.agent_name, row.user_id, row.version, row.actor)
                for table in (agent_documents_table, agent_document_versions_table)
                for row in conn.execute(select(table))
            ]
    finally:
        engine.dispose()


@pytest.mark.parametrize("own", [True, False], ids=["her-document", "the-agents-document"])
def test_erasing_a_user_while_it_writes_leaves_nothing_of_it(sql_url: str, own: bool) -> None:
    """The erase waits for the write in flight and takes what it wrote: no version of her
    document, and her name on no version of the agent's own, outlives it."""
    _configure(sql_url)
    scope = DocScope("coder", "alice" if own else None, "acme")
    _race_erase(scope, "alice", lambda: erase_user("alice", tenant_id="acme"))
    left = _rows(sql_url)
    assert not [row for row in left if row[3] == "alice" or row[5] == "alice"], left
    if not own:
        assert {row[4] for row in left} == {1, 2}  # the write landed, under no name


def test_erasing_an_agent_while_it_writes_leaves_nothing_of_it(sql_url: str) -> None:
    _configure(sql_url)
    _race_erase(SCOPE, "alice", lambda: ops.erase_agent_docs("coder", "acme"))
    assert _rows(sql_url) == []
    # Nothing left over: the document starts again from version 1 and goes on from there.
    for version in range(3):
        ops.write_doc(SCOPE, MAIN_DOC_PATH, f"v{version}", expected_version=version, author="agent")
