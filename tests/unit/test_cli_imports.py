"""``memstore --version`` and ``--help`` import click and the dispatch table, no command module
(issue 37 item 4: they took 1.2-3.0 s importing SQLAlchemy, Alembic, numpy and the LLM clients).

A command imports its own module when it runs; ``--help`` shows each command's one-line help from
``memstore.cli.commands.COMMANDS``, which must say what the command's own docstring says.
"""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from memstore.cli import main
from memstore.cli.commands import COMMANDS

# Libraries a start-up must not pay for: each one cost tenths of a second, some of them seconds.
HEAVY = (
    "alembic",
    "fastapi",
    "httpx",
    "mcp",
    "numpy",
    "openai",
    "psycopg",
    "pydantic",
    "pydantic_settings",
    "redis",
    "rich",
    "sqlalchemy",
    "sqlite_vec",
    "starlette",
    "tiktoken",
    "uvicorn",
    "yaml",
)
STARTUP = {"memstore", "memstore.cli", "memstore.cli.commands", "memstore.cli.help", "memstore.errors"}


def _modules_after(*argv: str) -> tuple[str, set[str]]:
    """Run ``memstore argv`` in a fresh interpreter: ``(stdout, every module it imported)``."""
    code = (
        "import sys\n"
        "from memstore.cli import main\n"
        "try:\n"
        f"    main({list(argv)!r}, prog_name='memstore')\n"
        "except SystemExit as exit:\n"
        "    assert not exit.code, exit.code\n"
        "print('\\0'.join(sorted(sys.modules)), file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return result.stdout, set(result.stderr.strip().split("\0"))


@pytest.mark.parametrize("argv", [("--version",), ("--help",)])
def test_version_and_help_import_no_command_and_no_heavy_library(argv: tuple[str, ...]) -> None:
    stdout, modules = _modules_after(*argv)
    assert stdout.startswith("memstore 0." if argv == ("--version",) else "Usage: memstore")
    heavy = sorted(name for name in modules if name.split(".")[0] in HEAVY)
    assert not heavy, heavy
    assert {name for name in modules if name.split(".")[0] == "memstore"} == STARTUP


def test_a_command_imports_its_own_module_and_no_other_command() -> None:
    _, modules = _modules_after("lifecycle", "--help")
    command_modules = {entry.module for entry in COMMANDS.values()}
    assert modules & command_modules == {"memstore.cli.lifecycle"}


def test_help_lists_every_command_with_its_own_one_line_help() -> None:
    """The table's line for each command is its docstring's first sentence, and ``--help`` shows
    the same list with every command loaded as with none."""
    lazy_help = main.get_help(click.Context(main, info_name="memstore", **main.context_settings))
    for name, entry in COMMANDS.items():
        command = main.commands[name]  # loads it
        assert entry.help == command.get_short_help_str(limit=10_000), name
        assert entry.module.startswith("memstore.cli.")
        assert all(module.startswith("memstore.cli.") for module, _ in entry.subcommands)
    loaded = click.Group("memstore", commands={name: main.commands[name] for name in COMMANDS})
    loaded.params = main.params
    loaded.help = main.help
    loaded_help = loaded.get_help(click.Context(loaded, info_name="memstore", **main.context_settings))
    assert lazy_help == loaded_help
    for name in COMMANDS:
        assert f"\n  {name} " in lazy_help
