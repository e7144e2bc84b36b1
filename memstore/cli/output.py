"""Shared output for the operator commands: Rich tables, progress and errors for people, JSON for scripts.

Rich styles only a terminal: when the stream is not one, or ``NO_COLOR`` is set, tables are
plain aligned text without box lines or colour, progress is a single line, and errors are the
usual ``Error: ...``, so what scripts and logs read does not depend on Rich's styling. ``--json``
never goes through Rich. Text from the store is passed as ``rich.text.Text``, never as markup,
without its control characters, so a fact cannot restyle or move the terminal.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

import click
import orjson

from memstore.cli.params import not_blank
from memstore.ops.view import one_line
from memstore.scope import lookup_user_id

MAX_CELL = 60
LAST_COLUMN_MIN = 24  # on a narrow terminal the last column shrinks to this, and rows wrap beyond
PLAIN_WIDTH = 100_000  # plain tables are never wrapped to a terminal width: cells are capped instead


def styled(stream: IO[str]) -> bool:
    """Whether ``stream`` gets Rich styling: a terminal, and ``NO_COLOR`` unset (no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2))


def echo_json_report(value: dict[str, Any]) -> None:
    """``echo_json`` for a report of many rows, through orjson: the same JSON values and layout.

    ``json.dumps`` with ``indent`` runs the pure-Python encoder: 8.5 s for the 75,000 expiring facts
    of a lifecycle run over 100,000 facts, where orjson takes a few hundredths of a second. Only for
    plain JSON values (orjson refuses what ``json`` would turn into strings, such as int keys).
    """
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2))


def echo_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """One row per line, columns aligned by display width (CJK text takes two cells a character).

    Every column is as wide as its widest cell (at most ``MAX_CELL``), so no id or number is
    cut; on a narrow terminal only the last column (the free text) gives way, down to
    ``LAST_COLUMN_MIN``, and a row that still does not fit wraps as the terminal wraps it.
    """
    from rich import box  # imported on use: a command that prints no table starts 0.2 s sooner
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    stdout = sys.stdout
    fancy = styled(stdout)
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [
        min(MAX_CELL, max([cell_len(header), *(cell_len(row[index]) for row in cells)]))
        for index, header in enumerate(headers)
    ]
    gap = 3  # a space each side of a cell, and the box's blank column rule between cells
    console = None
    if fancy:
        terminal = Console(file=stdout).width
        fixed = sum(widths[:-1]) + gap * (len(widths) - 1)
        shortest = min(widths[-1], max(cell_len(headers[-1]), LAST_COLUMN_MIN))
        widths[-1] = max(shortest, min(widths[-1], terminal - fixed))
        console = Console(file=stdout, highlight=False, width=max(terminal, fixed + widths[-1]))
    table = Table(
        box=box.SIMPLE_HEAD if fancy else None,
        header_style="bold" if fancy else "",
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
    )
    for header, width in zip(headers, widths, strict=True):
        table.add_column(header, width=width, overflow="ellipsis", no_wrap=True)
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))
    if console is not None:
        console.print(table, crop=False)
        return
    rendered = io.StringIO()
    Console(file=rendered, width=PLAIN_WIDTH, no_color=True, highlight=False).print(table)
    for line in rendered.getvalue().splitlines():
        click.echo(line.rstrip())


def echo_error(message: str) -> None:
    """``Error: message`` on stderr, the ``Error:`` in bold red on a terminal."""
    stderr = sys.stderr
    if styled(stderr):
        from rich.console import Console
        from rich.text import Text

        Console(file=stderr, highlight=False).print(Text.assemble(("Error: ", "bold red"), message))
    else:
        click.echo(f"Error: {message}", err=True)


class CliError(click.ClickException):
    """A one-line command failure (exit 1), shown by ``echo_error``."""

    def show(self, file: IO[Any] | None = None) -> None:
        if file is not None:
            super().show(file)
            return
        echo_error(self.format_message())


@contextmanager
def progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``; a Rich bar on a terminal's stderr, the label alone anywhere else."""
    stderr = sys.stderr
    if not stderr.isatty():
        click.echo(label, err=True)
        yield lambda _count: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=stderr, no_color=bool(os.environ.get("NO_COLOR")), highlight=False)
    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(label, total=total)
        yield lambda count: bar.advance(task, count)


def human_bytes(size: int) -> str:
    """``8,215,911`` bytes as ``7.8 MiB``: binary units, one decimal above a KiB."""
    if size < 1024:
        return f"{size} bytes"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"


def echo_counts(title: str, counts: dict[str, int]) -> None:
    click.echo(title)
    for name, count in counts.items():
        click.echo(f"  {name}: {count}")


def _cell(value: object) -> str:
    """Floats to two places; text as ``one_line`` makes it (no escapes, no extra rows)."""
    return one_line("" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value))


def user_id_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A lookup's ``--user`` takes a stored id or the external id a gateway saw (``alice@example.com``).

    Both find the scope the gateway wrote: see ``memstore.scope.lookup_user_id``. Commands that
    write a named scope (``import --user``, ``serve --user``) keep strict ids, so a typo is an
    error instead of a new scope. An empty value is a usage error, not the id it would map to.
    """
    value = not_blank(ctx, param, value)
    return None if value is None else lookup_user_id(value)
