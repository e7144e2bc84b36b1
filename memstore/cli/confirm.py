"""One rule for the commands that delete data (``erase``, ``vacuum``, ``queue purge``, ``db downgrade``,
``sessions clear``).

Each goes ahead with ``--yes``, asks on a terminal, and refuses without one. All but ``erase`` and
``sessions clear`` (whose question names what goes) first list what they delete, on stderr so
stdout stays their result (``--json`` stays parseable).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import click

from memstore.cli.exit_codes import EXIT_USAGE
from memstore.cli.output import CliError

yes_option = click.option(
    "--yes", is_flag=True, help="Do not ask before deleting (required without a terminal)."
)


class Refused(CliError):
    """No ``--yes`` and no terminal to ask on: a usage error (exit 2), on one line."""

    exit_code = EXIT_USAGE


def confirm_deletion(action: str, question: str, *, yes: bool) -> None:
    """Return when the deletion may go ahead; a "no" on the terminal aborts (exit 1).

    Without a terminal only ``--yes`` says yes: reading an answer from a pipe would take whatever
    a script happens to feed the command.
    """
    if yes:
        return
    if not sys.stdin.isatty():
        raise Refused(f"refusing to {action} without --yes when not run from a terminal")
    click.confirm(question, abort=True, err=True)


def echo_listing(title: str, lines: Iterable[str]) -> None:
    """What a command is about to delete, on stderr, before it asks."""
    click.echo(title, err=True)
    for line in lines:
        click.echo(f"  {line}", err=True)
