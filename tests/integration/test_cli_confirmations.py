"""The commands that delete data list it and ask first: the real console script, SQLite and PostgreSQL.

``db downgrade``, ``vacuum`` and ``queue purge`` print what they delete on stderr. Without
``--yes`` and without a terminal they refuse on one line with exit 2 and delete nothing; on a
terminal (a pseudo-terminal here) they ask, and "n" keeps every row; ``--yes`` goes ahead.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from memstore.config import MemoryConfig, set_memory_config
from memstore.queue import get_memory_queue, reset_memory_queue
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.schema import migrate
from tests.integration.conftest import Cli
from tests.support.terminal import run_on_terminal


def _count(cli: Cli, sql: str) -> int:
    with get_engine(cli.url).connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def _tables(cli: Cli) -> set[str]:
    return set(inspect(get_engine(cli.url)).get_table_names())


def _refused(result: subprocess.CompletedProcess[str], action: str) -> None:
    """Exit 2 and one line, not click's usage text."""
    assert result.returncode == 2, result
    last = result.stderr.splitlines()[-1]
    assert last == f"Error: refusing to {action} without --yes when not run from a terminal"
    assert "Usage:" not in result.stderr


@pytest.fixture
def stored(cli: Cli) -> Cli:
    """Alice's memory at head: three facts, one deleted since (a tombstone, and history)."""
    migrate.upgrade(cli.url)
    storage = SqlMemoryStorage(cli.url)
    facts = [{"id": f"f{i}", "content": f"Alice fact {i}", "confidence": 0.9} for i in range(3)]
    assert storage.save({"facts": facts}, user_id="alice")
    document = storage.load(user_id="alice")
    document["facts"].pop()
    assert storage.save(document, user_id="alice")
    return cli


@pytest.fixture
def dead(cli: Cli, tmp_path: Path) -> Iterator[dict[str, int]]:
    """Three dead conversations, two of alice's and one of bob's: thread id -> row id."""
    migrate.upgrade(cli.url)
    set_memory_config(
        MemoryConfig(
            data_dir=str(tmp_path / "data"), database_url=cli.url, extractor="rules", queue_workers=0
        )
    )
    reset_memory_storage()
    reset_memory_queue()
    turn = [{"role": "user", "content": "I prefer tea."}, {"role": "assistant", "content": "Noted."}]
    for thread, user in (("t1", "alice"), ("t2", "alice"), ("t3", "bob")):
        get_memory_queue().add(thread, turn, user_id=user)
    with get_engine(cli.url).begin() as conn:
        conn.execute(text("UPDATE memory_queue SET state = 'dead', attempts = 10, last_error = 'boom'"))
        ids = {row.thread_id: row.id for row in conn.execute(text("SELECT thread_id, id FROM memory_queue"))}
    yield ids
    reset_memory_queue()


def test_a_downgrade_that_drops_data_lists_it_and_refuses_without_yes(stored: Cli) -> None:
    head = migrate.head()
    facts = _count(stored, "SELECT count(*) FROM memory_facts")
    tables = _tables(stored)

    columns = stored("db", "downgrade", "0002")
    _refused(columns, "downgrade")
    assert f"from {head} to 0002 drops:\n" in columns.stderr
    assert "  table memory_queue: 0 rows\n" in columns.stderr
    assert f"  column memory_facts.access_count: {facts} rows\n" in columns.stderr
    assert "  index ix_memory_facts_live_category\n" in columns.stderr

    everything = stored("db", "downgrade", "base")
    _refused(everything, "downgrade")
    assert f"from {head} to <base> drops:\n" in everything.stderr
    assert f"  table memory_facts: {facts} rows\n" in everything.stderr
    assert "  table memory_scopes: 1 row\n" in everything.stderr

    assert stored("db", "current").stdout.endswith(f": {head} (head)\n")
    assert _tables(stored) == tables
    assert _count(stored, "SELECT count(access_count) FROM memory_facts") == facts

    done = stored("db", "downgrade", "0002", "--yes")
    assert done.returncode == 0, done.stderr
    assert "  table memory_queue: 0 rows\n" in done.stderr
    assert done.stdout.endswith(f": {head} -> 0002\n")
    assert "memory_queue" not in _tables(stored)
    assert _count(stored, "SELECT count(*) FROM memory_facts") == facts


def test_a_downgrade_that_drops_no_data_says_what_it_drops_and_goes_ahead(cli: Cli) -> None:
    head = migrate.head()
    migrate.upgrade(cli.url)

    index = cli("db", "downgrade", "0005")
    assert index.returncode == 0, index.stderr
    assert f"from {head} to 0005 drops:\n" in index.stderr
    assert "  index ix_memory_facts_live_category\n" in index.stderr
    assert index.stdout.endswith(f": {head} -> 0005\n")

    empty = cli("db", "downgrade", "base")  # every table goes, but none holds a row
    assert empty.returncode == 0, empty.stderr
    assert "  table memory_facts: 0 rows\n" in empty.stderr
    assert not _tables(cli) & {"memory_facts", "memory_scopes"}

    nothing = cli("db", "downgrade", "base")
    assert nothing.returncode == 0 and nothing.stderr == ""
    assert nothing.stdout.endswith(": already at <base>\n")


def test_a_downgrade_asks_on_a_terminal(stored: Cli) -> None:
    head = migrate.head()
    facts = _count(stored, "SELECT count(*) FROM memory_facts")

    code, stdout, terminal = run_on_terminal(stored.env, "db", "downgrade", "base", answer="n\n")
    assert code == 1 and "Aborted!" in terminal, terminal
    assert f"  table memory_facts: {facts} rows\n" in terminal
    assert "Drop them, and the data they hold? [y/N]" in terminal
    assert stdout == ""
    assert stored("db", "current").stdout.endswith(f": {head} (head)\n")
    assert _count(stored, "SELECT count(*) FROM memory_facts") == facts

    code, stdout, terminal = run_on_terminal(stored.env, "db", "downgrade", "base", answer="y\n")
    assert code == 0, terminal
    assert stdout.endswith(f": {head} -> <base>\n")
    assert "memory_facts" not in _tables(stored)


def test_vacuum_lists_what_it_purges_and_needs_yes(stored: Cli) -> None:
    history = _count(stored, "SELECT count(*) FROM memory_history")
    assert history > 0

    refused = stored("vacuum", "--older-than", "0")
    _refused(refused, "vacuum")
    assert "vacuum purges rows older than 0 day(s):\n" in refused.stderr
    assert "  memory_facts: 1\n" in refused.stderr  # the tombstone
    assert f"  memory_history: {history}\n" in refused.stderr
    assert _count(stored, "SELECT count(*) FROM memory_history") == history

    code, _stdout, terminal = run_on_terminal(stored.env, "vacuum", "--older-than", "0", answer="n\n")
    assert code == 1 and "Purge what is older than 0 day(s)? This cannot be undone [y/N]" in terminal
    assert _count(stored, "SELECT count(*) FROM memory_history") == history

    recent = stored("vacuum", "--older-than", "30")  # nothing that old: nothing to ask
    assert recent.returncode == 0, recent.stderr
    assert recent.stderr == "" and "memory_history: 0" in recent.stdout

    purged = stored("vacuum", "--older-than", "0", "--yes", "--json")
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout)["purged"] == {
        "memory_facts": 1,
        "memory_history": history,
        "memory_erasures": 0,
    }
    assert f"  memory_history: {history}\n" in purged.stderr
    assert _count(stored, "SELECT count(*) FROM memory_history") == 0
    assert _count(stored, "SELECT count(*) FROM memory_facts") == 2  # live memory untouched


def test_queue_purge_lists_dead_conversations_per_state_and_user(cli: Cli, dead: dict[str, int]) -> None:
    every = cli("queue", "purge", "--all")
    _refused(every, "purge")
    assert (
        "queue purge deletes 3 conversation(s):\n  dead, user alice: 2\n  dead, user bob: 1\n" in every.stderr
    )
    bobs = cli("queue", "purge", str(dead["t3"]))
    _refused(bobs, "purge")
    assert "queue purge deletes 1 conversation(s):\n  dead, user bob: 1\n" in bobs.stderr
    assert _count(cli, "SELECT count(*) FROM memory_queue") == 3

    code, _stdout, terminal = run_on_terminal(cli.env, "queue", "purge", "--all", answer="n\n")
    assert code == 1 and "Delete them? They will not be processed [y/N]" in terminal
    assert _count(cli, "SELECT count(*) FROM memory_queue") == 3

    code, stdout, terminal = run_on_terminal(cli.env, "queue", "purge", str(dead["t3"]), answer="y\n")
    assert code == 0, terminal
    assert stdout == "1 dead conversation(s) deleted\n"
    assert _count(cli, "SELECT count(*) FROM memory_queue WHERE user_id = 'bob'") == 0

    rest = cli("queue", "purge", "--all", "--yes")
    assert rest.returncode == 0 and "  dead, user alice: 2\n" in rest.stderr
    assert rest.stdout == "2 dead conversation(s) deleted\n"
    none_left = cli("queue", "purge", "--all")  # nothing to delete: nothing to ask, exit 4
    assert none_left.returncode == 4 and none_left.stderr == ""


def test_erase_refuses_on_one_line_too(stored: Cli) -> None:
    _refused(stored("erase", "--user", "alice"), "erase")
    assert _count(stored, "SELECT count(*) FROM memory_scopes") == 1
