"""``--help``: every command shows a worked example that its own parser accepts, and human metavars."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from memstore.cli import main
from memstore.cli.help import EXAMPLES

GENERIC = {"TEXT", "INTEGER", "FLOAT", "INTEGER RANGE", "FLOAT RANGE", "DATETIME"}


def _leaves(command: click.Command, path: str = "") -> Iterator[tuple[str, click.Command]]:
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _leaves(sub, f"{path} {name}".strip())
    else:
        yield path, command


LEAVES = dict(_leaves(main))


def test_every_command_has_exactly_one_example() -> None:
    assert set(EXAMPLES) == set(LEAVES)
    for path, command in LEAVES.items():
        assert command.epilog is not None and command.epilog.endswith(f"Example:\n  {EXAMPLES[path]}")


@pytest.mark.parametrize("path", sorted(EXAMPLES))
def test_the_example_parses_with_its_command(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deerflow-memory").mkdir()  # import checks that its PATH exists
    (tmp_path / "memstore-2026-11-21.jsonl.gz").touch()  # and restore that its FILE does
    words = shlex.split(EXAMPLES[path], comments=True)
    depth = len(path.split())
    assert words[: depth + 1] == ["memstore", *path.split()]
    context = LEAVES[path].make_context(path, words[depth + 1 :])  # raises on any bad option or value
    assert context.params is not None


def test_no_option_shows_a_type_name_where_its_value_belongs() -> None:
    for path, command in LEAVES.items():
        context = click.Context(command, info_name=path)
        for param in command.params:
            if isinstance(param, click.Option) and not param.is_flag:
                assert param.make_metavar(context) not in GENERIC, (path, param.name)


def test_help_shows_the_example_unwrapped() -> None:
    help_text = LEAVES["facts search"].get_help(click.Context(LEAVES["facts search"], info_name="search"))
    assert help_text.endswith(f"Example:\n    {EXAMPLES['facts search']}")
