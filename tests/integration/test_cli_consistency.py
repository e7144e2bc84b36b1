"""The CLI's consistency fixes of issue 30 (items 17-20, 23) through the real console entry point.

Usage errors exit 2 before any database is touched, URLs are echoed as typed, ``config show`` and
``embed --status`` report instead of leaving blanks or failing, ``lifecycle run`` summarises per
rule, and the default relative ``data_dir`` is pointed out. On SQLite and PostgreSQL wherever a
database is involved.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from memstore.cli.exit_codes import EXIT_NOTHING_MATCHED, EXIT_USAGE
from memstore.config import FILE_STORAGE_CLASS, MemoryConfig
from memstore.storage.sql.engine import database_url_from_config, dispose_engines, get_engine
from tests.integration.conftest import Cli


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_") and k != "OPENAI_API_KEY"}
    return env | extra


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _import(cli: Cli, tmp_path: Path, user: str, facts: list[dict[str, Any]]) -> None:
    path = tmp_path / f"{user}.json"
    path.write_text(
        json.dumps({"version": "1.0", "user": {}, "history": {}, "facts": facts}), encoding="utf-8"
    )
    imported = cli("import", str(path), "--user", user)
    assert imported.returncode == 0, imported.stderr


def _old_fact(index: int, category: str = "knowledge") -> dict[str, Any]:
    """A fact created years ago and never confirmed or used: its decay score is about 0."""
    return {
        "id": f"fact_{index:08d}",
        "content": f"old fact {index}",
        "category": category,
        "confidence": 0.5 + index / 100,
        "createdAt": "2020-01-01T00:00:00Z",
    }


# -- item 17: usage errors exit 2 ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["facts", "list", "--limit", "0"], "'--limit'"),
        (["facts", "list", "--limit", "1001"], "'--limit'"),
        (["facts", "list", "--offset", "-1"], "'--offset'"),
        (["facts", "list", "--min-confidence", "2"], "'--min-confidence'"),
        (["facts", "list", "--min-confidence", "nan"], "'--min-confidence'"),
        (
            ["facts", "list", "--since", "2026-01-03", "--until", "2026-01-01"],
            "--since is later than --until",
        ),
        (["facts", "list", "--agent", "../x"], "'--agent'"),
        (["facts", "list", "--user", ""], "'--user'"),
        (["facts", "search", ""], "'QUERY'"),
        (["facts", "search", "   "], "'QUERY'"),
        (["facts", "search", "tea", "--limit", "0"], "'--limit'"),
        (["history", "--user", "alice", "--limit", "0"], "'--limit'"),
        (["history", "--user", "alice", "--fact", ""], "'--fact'"),
        (["history", "--user", "alice", "--agent", "a/b"], "'--agent'"),
        (["show", "--user", "alice", "--agent", ""], "'--agent'"),
        (["erase", "--user", "", "--yes"], "'--user'"),
        (["export", "OUT", "--user", ""], "'--user'"),
        (["lifecycle", "run", "--below", "nan"], "'--below'"),
        (["lifecycle", "run", "--dry-run", "--limit", "-1"], "'--limit'"),
        (["embed", "--status", "--rebuild"], "choose one"),
        (["vacuum", "--older-than", "99999999999", "--yes"], "'--older-than'"),
        (["serve", "--user", "bad id!"], "'--user'"),
        (["serve", "--user", "alice", "--allowed-host", ""], "'--allowed-host'"),
        (["mcp", "--user", ""], "'--user'"),
        (["mcp", "--user", "alice", "--agent", "x/y"], "'--agent'"),
        (["import", "FILE", "--user", "bad id!"], "'--user'"),
        (["import", "FILE", "--user", "alice", "--agent", "bad/x"], "'--agent'"),
        (["db", "current", "--url", ""], "'--url'"),
        (["sessions", "list", "--user", ""], "'--user'"),
        (["sessions", "list", "--user", "alice", "--limit", "1001"], "'--limit'"),
        (["sessions", "show", "bad id!", "--user", "alice"], "'SESSION_ID'"),
        (["sessions", "show", "s1", "--user", "alice", "--max-tokens", "5"], "--max-tokens needs --context"),
        (["sessions", "show", "s1", "--user", "alice", "--context", "--max-tokens", "0"], "'--max-tokens'"),
        (["sessions", "clear", "s1", "--user", "alice", "--agent", "a/b", "--yes"], "'--agent'"),
        (["worker", "--metrics-port", "9999", "--metrics-host", ""], "'--metrics-host'"),
    ],
)
def test_a_bad_option_value_is_a_usage_error_before_the_database(
    tmp_path: Path, args: list[str], named: str
) -> None:
    """Against a database nobody listens on: reaching it would be exit 1, so exit 2 came first."""
    down = f"postgresql://postgres@127.0.0.1:{_closed_port()}/none"
    (tmp_path / "memory.json").write_text("{}", encoding="utf-8")
    named_paths = {"OUT": str(tmp_path / "out"), "FILE": str(tmp_path / "memory.json")}
    args = [named_paths.get(arg, arg) for arg in args]
    result = Cli(_clean_env(MEMSTORE_DATABASE_URL=down), url=down)(*args)
    assert result.returncode == EXIT_USAGE, (args, result.stderr)
    assert "Usage: memstore" in result.stderr and named in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_valid_values_at_the_bounds_still_run(cli: Cli, tmp_path: Path) -> None:
    _import(cli, tmp_path, "alice", [{"id": "f1", "content": "Alice drinks tea", "confidence": 1.0}])
    page = cli.json("facts", "list", "--limit", "1000", "--min-confidence", "1", "--agent", "Coder")
    assert page["facts"] == []
    found = cli.json("facts", "search", "tea", "--limit", "1", "--min-confidence", "0")
    assert [fact["fact_id"] for fact in found["facts"]] == ["f1"]
    assert cli("history", "--user", "alice", "--limit", "1000").returncode == 0


# -- item 18: URLs as typed ---------------------------------------------------------------------


def test_a_schema_error_names_the_url_as_typed(cli: Cli) -> None:
    """The revision check printed the engine's URL: ``postgresql+psycopg://`` and a re-sorted query."""
    assert cli("db", "upgrade").returncode == 0
    with get_engine(cli.url).begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    dispose_engines()
    if cli.url.startswith("sqlite"):
        typed = f"{cli.url}?timeout=30&cached_statements=64"
    else:
        typed = (
            cli.url.replace("postgresql+psycopg://", "postgresql://")
            + "?connect_timeout=9&application_name=t"
        )
    cli.env["MEMSTORE_DATABASE_URL"] = typed
    for args in (["show", "--user", "alice"], ["stats"], ["facts", "list"]):
        result = cli(*args)
        assert result.returncode == 1, result
        assert f"database {typed} is at revision 9999, which this memstore does not know" in result.stderr
        assert "postgresql+psycopg" not in result.stderr


def test_an_unsupported_url_is_named_as_typed(tmp_path: Path) -> None:
    typed = "mysql://app:s3cret@db/memory?b=1&a=2"
    result = Cli(_clean_env(MEMSTORE_DATABASE_URL=typed), url=typed)("stats")
    assert result.returncode == 1
    assert "'mysql://app:***@db/memory?b=1&a=2': only sqlite and postgresql are supported" in result.stderr


# -- item 19: config show's queue_backend, embed --status without a provider --------------------


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, {"value": "database", "source": "derived from storage_class"}),
        (
            {"MEMSTORE_STORAGE_CLASS": FILE_STORAGE_CLASS},
            {"value": "memory", "source": "derived from storage_class"},
        ),
        (
            {"MEMSTORE_QUEUE_BACKEND": "memory"},
            {"value": "memory", "source": "environment (MEMSTORE_QUEUE_BACKEND)"},
        ),
    ],
)
def test_config_show_gives_the_queue_backend_in_effect(
    tmp_path: Path, extra: dict[str, str], expected: dict[str, str]
) -> None:
    cli = Cli(_clean_env(MEMSTORE_DATA_DIR=str(tmp_path / "data"), **extra), url="")
    assert cli.json("config", "show")["queue_backend"] == expected
    table = cli("config", "show")
    row = next(line for line in table.stdout.splitlines() if line.startswith("queue_backend"))
    assert row.split(None, 2) == ["queue_backend", expected["value"], expected["source"]]


def test_embed_status_without_a_provider_is_a_status(cli: Cli, tmp_path: Path) -> None:
    _import(cli, tmp_path, "alice", [{"id": "f1", "content": "Alice drinks tea"}])
    status = cli("embed", "--status")
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0].startswith("model:      none (embedding_provider is none")
    assert "live facts: 1" in status.stdout and status.stderr == ""
    report = cli.json("embed", "--status")
    assert report["model"] is None and report["live_facts"] == 1 and report["missing"] is None
    refused = cli("embed")
    assert refused.returncode == 1 and "embedding_provider is none" in refused.stderr


def test_embed_status_on_the_file_provider_says_it_keeps_no_vectors(tmp_path: Path) -> None:
    env = _clean_env(MEMSTORE_DATA_DIR=str(tmp_path / "data"), MEMSTORE_STORAGE_CLASS=FILE_STORAGE_CLASS)
    status = Cli(env, url="")("embed", "--status")
    assert status.returncode == 0, status.stderr
    assert "backend:    none (this storage provider keeps no vectors)" in status.stdout


# -- item 20: lifecycle run -----------------------------------------------------------------------


def test_a_dry_run_with_nothing_configured_reports_each_rule(cli: Cli, tmp_path: Path) -> None:
    _import(cli, tmp_path, "alice", [_old_fact(1), _old_fact(2, category="correction")])
    dry = cli("lifecycle", "run", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    assert lines[0].startswith("lifecycle dry run at ") and lines[0].endswith("1 scope(s), 2 live fact(s)")
    assert lines[1:] == [
        "expiry:     off: expire_below is not set (--below X shows what a threshold would remove)",
        "protected:  1 fact(s) never expire (categories: correction)",
        "cap:        no scope is over max_facts 100",
    ]
    report = cli.json("lifecycle", "run", "--dry-run")
    assert report["threshold"] is None and report["expiring"] == [] and report["protected"]["facts"] == 1
    real = cli("lifecycle", "run")
    assert real.returncode == 1 and "expire_below is not set" in real.stderr
    nobody = cli("lifecycle", "run", "--dry-run", "--user", "nobody")
    assert nobody.returncode == EXIT_NOTHING_MATCHED and "nothing is stored for nobody" in nobody.stderr


def test_a_dry_run_summarises_and_lists_only_what_limit_asks(cli: Cli, tmp_path: Path) -> None:
    _import(cli, tmp_path, "alice", [_old_fact(index) for index in range(1, 31)])
    cli.env["MEMSTORE_MAX_FACTS"] = "10"
    summary = cli("lifecycle", "run", "--dry-run")
    assert "cap:        20 fact(s) over max_facts 10 in 1 scope(s)" in summary.stdout

    dry = cli("lifecycle", "run", "--dry-run", "--below", "0.2")
    assert dry.returncode == 0, dry.stderr
    assert "expiry:     would remove 30 fact(s) with decay below 0.2 (in 1 scope(s))" in dry.stdout
    assert "cap:        no scope is over max_facts 10" in dry.stdout  # what expiry leaves is under it
    assert "old fact" not in dry.stdout and "--limit N lists them" in dry.stdout
    assert len(dry.stdout.splitlines()) == 5

    listed = cli("lifecycle", "run", "--dry-run", "--below", "0.2", "--limit", "2")
    rows = [line for line in listed.stdout.splitlines() if line.startswith("alice")]
    assert [row.split()[2] for row in rows] == ["fact_00000001", "fact_00000002"]  # lowest decay first
    assert listed.stdout.splitlines()[-1] == "listed the 2 lowest of 30; --limit N lists more"

    everything = cli.json("lifecycle", "run", "--dry-run", "--below", "0.2")
    assert everything["expiring_count"] == 30 and len(everything["expiring"]) == 30
    assert len(cli.json("lifecycle", "run", "--dry-run", "--below", "0.2", "--limit", "3")["expiring"]) == 3

    run = cli("lifecycle", "run", "--below", "0.2")
    assert run.returncode == 0 and "expiry:     removed 30 fact(s)" in run.stdout
    again = cli("lifecycle", "run", "--below", "0.2")
    assert again.returncode == 0 and "expiry:     removed 0 fact(s)" in again.stdout  # a result


# -- item 23: the default relative data_dir -------------------------------------------------------


def _stats_in(cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    return subprocess.run(
        [executable, "stats"], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_the_default_relative_data_dir_is_pointed_out_once(tmp_path: Path) -> None:
    result = _stats_in(tmp_path, _clean_env())
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING memstore")]
    assert len(warnings) == 1, result.stderr
    assert f"keeps its data in {tmp_path.resolve() / '.memstore'}, relative to the working" in warnings[0]
    url = f"sqlite:///{tmp_path / 'given.db'}"
    for extra in (
        {"MEMSTORE_DATA_DIR": str(tmp_path / "absolute")},
        {"MEMSTORE_DATA_DIR": "./chosen"},  # a relative folder someone chose: no surprise
        {"MEMSTORE_DATABASE_URL": url},
    ):
        quiet = _stats_in(tmp_path, _clean_env(**extra))
        assert quiet.returncode == 0 and "WARNING" not in quiet.stderr, (extra, quiet.stderr)


def test_a_library_process_is_warned_once_on_memstore_s_logger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)  # the warning is once per folder: this test's own
    config = MemoryConfig()
    with caplog.at_level(logging.WARNING, logger="memstore"):
        first = database_url_from_config(config)
        assert database_url_from_config(config) == first
    warned = [record for record in caplog.records if "data_dir is not set" in record.getMessage()]
    assert len(warned) == 1 and warned[0].name.startswith("memstore.")
    assert warned[0].levelno == logging.WARNING
    assert first == f"sqlite:///{tmp_path.resolve() / '.memstore' / 'memory.db'}"
    caplog.clear()
    database_url_from_config(MemoryConfig(data_dir="./.memstore"))  # set explicitly: a choice
    assert not caplog.records
