"""The repository's shared pages and legal files (issue 30, item 23).

A Markdown table ends at the first line that is not a row: a row after a paragraph is printed as
text, which is how ``GET /api/memory/status`` dropped out of the endpoint table. And the license
``pyproject.toml`` declares must be the one shipped.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
"""Of https://www.apache.org/licenses/LICENSE-2.0.txt, the text projects ship as LICENSE."""


def _prose_lines(page: Path) -> list[str]:
    """The page's lines with fenced code blocks blanked out (a ``|`` there is code, not a table)."""
    lines, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_table_row_belongs_to_a_table(page: Path) -> None:
    lines = _prose_lines(page)
    for index, line in enumerate(lines):
        if not line.startswith("|"):
            continue
        continues = index > 0 and lines[index - 1].startswith("|")
        starts = index + 1 < len(lines) and SEPARATOR.match(lines[index + 1]) is not None
        assert continues or starts, f"{page.name}:{index + 1} is a table row outside a table: {line[:80]}"


def test_the_endpoint_table_lists_every_route_of_the_router() -> None:
    from memstore.integrations.fastapi import create_memory_router

    lines = _prose_lines(REPO / "docs" / "integrations.md")
    header = next(index for index, line in enumerate(lines) if line.startswith("| method and path |"))
    rows: set[str] = set()
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        rows.add(line.split("|")[1].strip().strip("`"))
    from fastapi.routing import APIRoute

    routes = {
        f"{method} {route.path}".replace("{fact_id}", "{id}")
        for route in create_memory_router(lambda: "alice").routes
        if isinstance(route, APIRoute)
        for method in route.methods or ()
    }
    assert rows == routes


def test_the_license_is_the_apache_2_0_text_pyproject_declares() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["license"]
    assert declared == "Apache-2.0"
    assert hashlib.sha256((REPO / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256
