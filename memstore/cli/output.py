"""Shared output for the operator commands: aligned tables for people, JSON for scripts."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from typing import Any

import click

from memstore.scope import lookup_user_id

MAX_CELL = 60


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2))


def echo_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns padded by display width, so CJK text (two cells per character) still lines up."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [
        max([_width(header), *(_width(row[index]) for row in cells)]) for index, header in enumerate(headers)
    ]
    for row in [list(headers), *cells]:
        click.echo("  ".join(_pad(text, width) for text, width in zip(row, widths, strict=True)).rstrip())


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
    text = "" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)
    text = " ".join(text.split())
    if _width(text) <= MAX_CELL:
        return text
    kept = ""
    for char in text:
        if _width(kept + char) > MAX_CELL - 1:
            break
        kept += char
    return kept + "…"


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)


def _pad(text: str, width: int) -> str:
    return text + " " * (width - _width(text))


def user_id_option(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A lookup's ``--user`` takes a stored id or the external id a gateway saw (``alice@example.com``).

    Both find the scope the gateway wrote: see ``memstore.scope.lookup_user_id``. Commands that
    write a named scope (``import --user``, ``serve --user``) keep strict ids, so a typo is an
    error instead of a new scope.
    """
    return None if value is None else lookup_user_id(value)
