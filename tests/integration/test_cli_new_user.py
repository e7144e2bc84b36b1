"""What a new user stumbled on with the CLI (issue 14), through the real console entry point.

Each test runs ``memstore`` as a subprocess on SQLite and PostgreSQL (and the file provider where
the behaviour is about it), reading stdout, stderr and the exit code as a user or a script would.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from memstore.cli.exit_codes import EXIT_CANNOT_LISTEN, EXIT_NOTHING_MATCHED
from memstore.config import FILE_STORAGE_CLASS, MemoryConfig
from tests.integration.conftest import Cli


def _import_alice(cli: Cli, tmp_path: Path) -> None:
    document = {
        "version": "1.0",
        "user": {},
        "history": {},
        "facts": [
            {"id": "fact_a1", "content": "Alice drinks tea", "category": "preference", "confidence": 0.9}
        ],
    }
    path = tmp_path / "alice.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    imported = cli("import", str(path), "--user", "alice")
    assert imported.returncode == 0, imported.stderr


def test_show_says_when_nothing_is_stored(cli: Cli, tmp_path: Path) -> None:
    _import_alice(cli, tmp_path)
    shown = cli("show", "--user", "alice")
    assert shown.returncode == 0 and "Alice drinks tea" in shown.stdout

    for args in (
        ["--user", "nobody"],
        ["--user", "alice", "--agent", "coder"],
        ["--user", "nobody", "--json"],
    ):
        missing = cli("show", *args)
        assert missing.returncode == EXIT_NOTHING_MATCHED, missing
        assert missing.stdout == "" and "nothing is stored for" in missing.stderr
        assert "last updated" not in missing.stderr


def test_erase_of_an_unknown_user_erases_nothing_and_says_so(cli: Cli, tmp_path: Path) -> None:
    _import_alice(cli, tmp_path)
    typo = cli("erase", "--user", "alcie", "--yes")
    assert typo.returncode == EXIT_NOTHING_MATCHED
    assert "nothing was stored for user 'alcie' (check the id)" in typo.stderr
    assert typo.stdout == ""
    # The erasure is still recorded (updates for the id may be queued); vacuum purges such records.
    purged = cli.json("vacuum", "--older-than", "0", "--yes")
    assert purged["purged"]["memory_erasures"] == 1
    assert "Alice drinks tea" in cli("show", "--user", "alice").stdout

    erased = cli("erase", "--user", "alice", "--yes")
    assert erased.returncode == 0 and "erased user alice" in erased.stdout


def test_stats_prints_human_units_and_json_keeps_bytes(cli: Cli, tmp_path: Path) -> None:
    _import_alice(cli, tmp_path)
    table = cli("stats")
    assert table.returncode == 0, table.stderr
    size_line = next(line for line in table.stdout.splitlines() if line.startswith("size on disk:"))
    assert re.fullmatch(r"size on disk: \d+\.\d (KiB|MiB|GiB)", size_line), size_line
    figures = cli.json("stats")
    assert isinstance(figures["database_bytes"], int) and figures["database_bytes"] > 1024


def test_verbose_works_after_the_subcommand_and_hides_alembic_chatter(cli: Cli) -> None:
    for args in (["-v", "db", "upgrade"], ["db", "upgrade", "-v"], ["db", "current", "--verbose"]):
        result = cli(*args)
        assert result.returncode == 0, result.stderr
        assert "Context impl" not in result.stderr and "Will assume" not in result.stderr
    first = cli("db", "downgrade", "base")
    assert first.returncode == 0, first.stderr
    upgraded = cli("db", "upgrade", "-v")
    assert "INFO memstore" in upgraded.stderr  # memstore's own INFO lines do show


def test_a_bad_url_is_shown_as_typed(cli: Cli) -> None:
    result = cli("db", "current", "--url", "postgresql//missing-colon@host/db")
    assert result.returncode == 1
    assert "'postgresql//missing-colon@host/db' is not a valid SQLAlchemy URL" in result.stderr
    secret = cli("db", "current", "--url", "postgresql+psycopg://u:hunter2secret@127.0.0.1:1/db")
    assert secret.returncode == 1
    assert "hunter2secret" not in secret.stderr + secret.stdout
    assert "postgresql+psycopg://u:***@127.0.0.1:1/db" in secret.stderr


def test_db_commands_say_the_file_provider_has_no_database(tmp_path: Path) -> None:
    cli = Cli(
        {
            **{k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")},
            "MEMSTORE_DATA_DIR": str(tmp_path / "data"),
            "MEMSTORE_STORAGE_CLASS": FILE_STORAGE_CLASS,
        },
        url="",
    )
    for args in (["db", "current"], ["db", "upgrade"]):
        result = cli(*args)
        assert result.returncode == 1
        assert "keeps no database" in result.stderr and FILE_STORAGE_CLASS in result.stderr
    assert not (tmp_path / "data" / "memory.db").exists()
    other = f"sqlite:///{tmp_path / 'other.db'}"
    for args in (["db", "upgrade", "--url", other], ["db", "current", "--url", other]):
        explicit = cli(*args)
        assert explicit.returncode == 0, explicit.stderr


@pytest.mark.parametrize("args", [["show", "--user", "nobody"], ["erase", "--user", "nobody", "--yes"]])
def test_nothing_matched_on_the_file_provider_too(tmp_path: Path, args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env |= {"MEMSTORE_DATA_DIR": str(tmp_path / "data"), "MEMSTORE_STORAGE_CLASS": FILE_STORAGE_CLASS}
    result = Cli(env, url="")(*args)
    assert result.returncode == EXIT_NOTHING_MATCHED and "nothing" in result.stderr


@pytest.mark.parametrize("command", [["stats"], ["show", "--user", "alice"], ["facts", "list"]])
def test_errors_are_one_line_and_the_detail_comes_with_verbose(tmp_path: Path, command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    broken = tmp_path / "memstore.yaml"
    broken.write_text("memory:\n  debounce_seconds: [1\n  max_facts: 2\n", encoding="utf-8")
    cases = {
        "yaml": env | {"MEMSTORE_CONFIG": str(broken)},
        # Port 1 refuses connections; psycopg adds a second "Is the server running" line.
        "database down": env | {"MEMSTORE_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/none"},
    }
    for case, case_env in cases.items():
        quiet = Cli(case_env, url="")(*command)
        assert quiet.returncode == 1, (case, quiet)
        assert len(quiet.stderr.strip().splitlines()) == 1, (case, quiet.stderr)
        assert "Traceback" not in quiet.stderr and "-v for the details" in quiet.stderr
        verbose = Cli(case_env, url="")(*command, "-v")
        assert verbose.returncode == 1 and "Traceback" in verbose.stderr, (case, verbose.stderr)


def test_serve_on_a_busy_port_says_so_once_with_its_own_exit_code(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_DATA_DIR"] = str(tmp_path / "data")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = Cli(env, url="")("serve", "--user", "alice", "--port", str(port))
    assert result.returncode == EXIT_CANNOT_LISTEN, result
    assert "serving" not in result.stdout
    assert result.stderr.strip().splitlines() == [
        f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]


def test_an_unknown_category_filter_is_pointed_out(cli: Cli, tmp_path: Path) -> None:
    _import_alice(cli, tmp_path)
    bogus = cli("facts", "list", "--category", "bogus")
    assert bogus.returncode == 0
    assert "'bogus' is not one of the categories" in bogus.stderr
    known = cli("facts", "list", "--category", "preference")
    assert known.returncode == 0 and known.stderr == "" and "Alice drinks tea" in known.stdout


def test_version_is_the_installed_distributions() -> None:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    result = subprocess.run([executable, "--version"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"memstore {importlib.metadata.version('memstore')}\n"


def test_config_names_the_settings_file_before_or_after_the_subcommand(tmp_path: Path) -> None:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    env["MEMSTORE_DATA_DIR"] = str(tmp_path / "data")  # where the database would go without the file

    def memstore(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([executable, *args], capture_output=True, text=True, env=env, check=False)

    database = tmp_path / "from-file.db"
    settings = tmp_path / "memstore.yaml"
    settings.write_text(f"memory:\n  database_url: sqlite:///{database}\n", encoding="utf-8")
    assert memstore("db", "upgrade", "--config", str(settings)).returncode == 0
    assert database.exists() and not (tmp_path / "data").exists()
    shown = memstore("--config", str(settings), "stats")
    assert shown.returncode == 0 and f"sqlite:///{database}" in shown.stdout
    missing = memstore("stats", "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    settings.write_text("memory:\n  max_facts: lots\n", encoding="utf-8")
    bad = memstore("stats", "--config", str(settings))
    assert bad.returncode == 1 and bad.stderr.startswith("Error: invalid memory config: max_facts")
    assert len(bad.stderr.splitlines()) == 1


def test_config_show_names_each_setting_s_source_and_masks_secrets(tmp_path: Path) -> None:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    settings = tmp_path / "memstore.yaml"
    settings.write_text(
        "memory:\n  max_facts: 50\n  database_url: postgresql://memstore:db-s3cret@db/memstore\n"
        "  operator_database_url: postgresql://operator:op-s3cret@db/memstore\n"
        "  database_read_url: postgresql://reader:replica-s3cret@replica/memstore\n",
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_") and k != "OPENAI_API_KEY"}
    env |= {"MEMSTORE_DEBOUNCE_SECONDS": "10", "OPENAI_API_KEY": "sk-key-s3cret"}
    result = subprocess.run(
        [executable, "config", "show", "--json", "--config", str(settings)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert list(shown) == list(MemoryConfig.model_fields)
    assert shown["max_facts"] == {"value": 50, "source": f"file ({settings})"}
    assert shown["database_url"] == {
        "value": "postgresql://memstore:***@db/memstore",
        "source": f"file ({settings})",
    }
    assert shown["operator_database_url"]["value"] == "postgresql://operator:***@db/memstore"
    assert shown["database_read_url"]["value"] == "postgresql://reader:***@replica/memstore"
    assert shown["debounce_seconds"]["source"] == "environment (MEMSTORE_DEBOUNCE_SECONDS)"
    assert shown["llm_api_key"] == {"value": "***", "source": "environment (OPENAI_API_KEY)"}
    assert shown["mode"] == {"value": "middleware", "source": "default"}
    assert "s3cret" not in result.stdout
    table = subprocess.run(
        [executable, "config", "show", "--config", str(settings)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert (
        table.stdout.splitlines()[0].split() == ["SETTING", "VALUE", "SOURCE"]
        and "s3cret" not in table.stdout
    )


def test_shell_completion_works_as_documented() -> None:
    executable = shutil.which("memstore", path=str(Path(sys.executable).parent))
    assert executable is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_")}
    script = subprocess.run(
        [executable],
        env={**env, "_MEMSTORE_COMPLETE": "bash_source"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert "_memstore_completion" in script.stdout
    completed = subprocess.run(
        [executable],
        env={**env, "_MEMSTORE_COMPLETE": "bash_complete", "COMP_WORDS": "memstore fa", "COMP_CWORD": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.stdout.split() == ["plain,facts"]
