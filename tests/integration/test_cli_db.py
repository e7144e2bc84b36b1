"""``memstore db heads``, ``db stamp`` and ``db check`` (issue 30 item 12), through the console entry point.

What a DBA asks after a deploy or a restore: which revision does this memstore want, is the
database there, and does its schema still match what the migrations create. Each on SQLite and
PostgreSQL, with a schema changed by hand the way it happens in practice.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect, text

from memstore.storage.sql.engine import dispose_engines, get_engine
from memstore.storage.sql.schema import migrate
from tests.integration.conftest import Cli


def _columns(url: str, table: str) -> set[str]:
    try:
        return {column["name"] for column in inspect(get_engine(url)).get_columns(table)}
    finally:
        dispose_engines()


def test_heads_names_the_revision_upgrade_goes_to(cli: Cli) -> None:
    result = cli("db", "heads")
    assert result.returncode == 0
    [script] = [s for s in migrate.history() if s.is_head]
    assert result.stdout == f"{migrate.head()} (head): {(script.doc or '').strip()}\n"


def test_check_and_stamp_a_database_behind_and_at_head(cli: Cli) -> None:
    assert cli("db", "upgrade").returncode == 0
    head, previous = migrate.head(), migrate.history()[1].revision
    checked = cli("db", "check")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout == f"{cli.url}: at head {head}; the schema matches memstore's models\n"

    columns = _columns(cli.url, "memory_queue")
    stamped = cli("db", "stamp", previous)
    assert stamped.returncode == 0, stamped.stderr
    assert stamped.stdout == f"{cli.url}: {head} -> {previous} (stamped: no migration ran)\n"
    assert _columns(cli.url, "memory_queue") == columns  # no DDL ran
    behind = cli("db", "check")
    assert behind.returncode == 1 and behind.stdout == ""
    assert behind.stderr == (
        f"Error: database {cli.url} is at revision {previous}, head is {head}: run `memstore db upgrade`\n"
    )
    assert cli("db", "stamp", "head").returncode == 0
    assert cli("db", "check").returncode == 0

    unknown = cli("db", "stamp", "no_such_revision")
    assert unknown.returncode == 1 and "no_such_revision" in unknown.stderr
    assert len(unknown.stderr.splitlines()) == 1


def test_check_lists_what_was_changed_by_hand_and_ignores_other_tables(cli: Cli) -> None:
    assert cli("db", "upgrade").returncode == 0
    with get_engine(cli.url).begin() as conn:
        conn.execute(text("ALTER TABLE memory_facts ADD COLUMN note TEXT"))
        conn.execute(text("DROP INDEX ix_memory_facts_live_category"))
        conn.execute(text("CREATE TABLE other_app_sessions (id INTEGER PRIMARY KEY)"))
    dispose_engines()
    result = cli("db", "check")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"{cli.url} differs from memstore's models at {migrate.head()}:",
        "  missing index memory_facts.ix_memory_facts_live_category",
        "  extra column memory_facts.note",
        f"Error: database {cli.url} is at head {migrate.head()}, but its schema differs from memstore's "
        "models in 2 place(s), listed above: changed outside the migrations",
    ]


def test_check_and_stamp_refuse_a_missing_sqlite_file(tmp_path: Path, cli: Cli) -> None:
    missing = f"sqlite:///{tmp_path / 'nowhere' / 'memory.db'}"
    for args in (["check"], ["stamp", "head"], ["current"]):
        result = cli("db", *args, "--url", missing)
        assert result.returncode == 1, args
        assert result.stderr == (
            f"Error: no database at {missing}: the SQLite file does not exist "
            "(check the path; `memstore db upgrade` creates it)\n"
        )
    assert not (tmp_path / "nowhere").exists()
