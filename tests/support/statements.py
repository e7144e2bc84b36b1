"""Counting the SQL a test causes: every statement sent to the driver, as the driver saw it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event


@contextmanager
def sent_statements(engine: Engine) -> Iterator[list[tuple[str, int]]]:
    """Each statement (whitespace collapsed) with its number of parameter sets (executemany)."""
    seen: list[tuple[str, int]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, many: bool) -> None:
        seen.append((" ".join(statement.split()), len(parameters) if many else 1))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)
