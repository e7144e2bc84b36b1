"""Rich output (issue 20, item 5): styled on a terminal, plain for pipes and ``NO_COLOR``.

The console script runs for real, with its output on a pipe or on a pseudo-terminal. A fact
carrying Rich markup and a terminal escape shows the markup as text and loses the escape.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.terminal import memstore_executable, run_on_terminal

BOLD = "\x1b[1m"
HOSTILE = "[bold red]Alice[/bold red] likes \x1b[2J\x1b[31mred\x1b[0m\n\u202etea \x9b32m"
INERT = "[bold red]Alice[/bold red] likes [2J[31mred[0m tea 32m"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTORE_") and k != "NO_COLOR"}
    env["MEMSTORE_DATA_DIR"] = str(tmp_path / "data")
    env["TERM"] = "xterm-256color"
    return env


def _piped(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [memstore_executable(), *args], env=env, capture_output=True, text=True, check=False
    )


def _seed(env: dict[str, str]) -> None:
    result = _piped(env, "db", "upgrade")
    assert result.returncode == 0, result.stderr
    # Written through the library, as a gateway would: escapes are not refused on the way in.
    script = (
        "from memstore.ops.facts import create_memory_fact\n"
        f"create_memory_fact({HOSTILE!r}, 'preference', user_id='alice')\n"
        "create_memory_fact('用户喜欢简洁的中文回答', 'preference', user_id='wei')\n"
    )
    seeded = subprocess.run(
        [str(Path(memstore_executable()).parent / "python"), "-c", script],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert seeded.returncode == 0, seeded.stderr


def test_a_table_is_styled_on_a_terminal_and_plain_elsewhere(env: dict[str, str]) -> None:
    _seed(env)
    piped = _piped(env, "facts", "list")
    assert piped.returncode == 0 and "\x1b" not in piped.stdout
    header, *rows = piped.stdout.splitlines()
    assert header.split() == ["USER", "AGENT", "ID", "CATEGORY", "CONF", "CREATED", "CONTENT"]
    # Columns line up by display width: the CJK row's content starts where the header's does.
    start = header.index("CONTENT")
    wei = next(row for row in rows if row.startswith("wei"))
    assert wei[start:] == "用户喜欢简洁的中文回答"
    alice = next(row for row in rows if row.startswith("alice"))
    # Markup stays text; the escapes lose their ESC, so what is left is inert text.
    assert alice[start:] == INERT

    code, _, terminal = run_on_terminal(env, "facts", "list", stdout_too=True)
    assert code == 0
    assert BOLD in terminal and "─" in terminal  # a bold header over a rule
    assert INERT in terminal and "\x1b[2J" not in terminal and "\x1b[31m" not in terminal, terminal

    code, _, no_color = run_on_terminal({**env, "NO_COLOR": "1"}, "facts", "list", stdout_too=True)
    assert code == 0 and no_color == piped.stdout


def test_a_narrow_terminal_cuts_only_the_free_text(env: dict[str, str]) -> None:
    _seed(env)
    piped = _piped(env, "facts", "list", "--json")
    ids = [fact["fact_id"] for fact in json.loads(piped.stdout)["facts"]]
    code, _, terminal = run_on_terminal(env, "facts", "list", stdout_too=True, columns=60)
    assert code == 0
    assert all(fact_id in terminal for fact_id in ids)  # never "fact_1a…"
    for header in ("USER", "AGENT", "ID", "CATEGORY", "CONF", "CREATED", "CONTENT"):
        assert header in terminal


def test_show_prints_stored_text_inert(env: dict[str, str]) -> None:
    _seed(env)
    code, _, terminal = run_on_terminal(env, "show", "--user", "alice", stdout_too=True)
    assert code == 0 and INERT in terminal
    assert all(mark not in terminal for mark in ("\x1b[2J", "\x9b", "\u202e"))


def test_json_does_not_change_on_a_terminal(env: dict[str, str]) -> None:
    _seed(env)
    piped = _piped(env, "facts", "list", "--json")
    code, _, terminal = run_on_terminal(env, "facts", "list", "--json", stdout_too=True)
    assert code == 0 and terminal == piped.stdout
    assert {fact["user_id"] for fact in json.loads(piped.stdout)["facts"]} == {"alice", "wei"}


def test_errors_are_red_on_a_terminal_and_plain_in_a_pipe(env: dict[str, str]) -> None:
    env["MEMSTORE_DATABASE_URL"] = "postgresql://memstore:pw@127.0.0.1:1/memstore"
    piped = _piped(env, "stats")
    assert piped.returncode == 1 and piped.stderr.startswith("Error: cannot read memory at postgresql://")
    code, _, terminal = run_on_terminal(env, "stats")
    assert code == 1 and "\x1b[1;31mError: \x1b[0m" in terminal and "cannot read memory" in terminal
    code, _, plain = run_on_terminal({**env, "NO_COLOR": "1"}, "stats")
    assert code == 1 and plain == piped.stderr


def test_progress_is_a_bar_on_a_terminal_and_one_line_in_a_pipe(env: dict[str, str], tmp_path: Path) -> None:
    tree = tmp_path / "tree" / "users"
    for user in ("ann", "ben", "cid"):
        (tree / user).mkdir(parents=True)
        (tree / user / "memory.json").write_text(
            json.dumps(
                {"facts": [{"id": f"f-{user}", "content": f"{user} likes tea", "category": "preference"}]}
            ),
            encoding="utf-8",
        )
    code, stdout, terminal = run_on_terminal(env, "import", str(tmp_path / "tree"))
    assert code == 0 and "imported: 3" in stdout
    assert "Importing" in terminal and "━" in terminal and "3/3" in terminal
    piped = _piped(env, "export", str(tmp_path / "out"))
    assert piped.returncode == 0 and piped.stderr == "Exporting\n"
