"""Bounds on what a console request may name, so a hostile or mistyped one is a 4xx, never a 500.

The databases take what the routes pass on: PostgreSQL refuses a NUL in any text parameter and
both refuse an integer past 64 bits, and either failure used to surface as a 500 (or a misleading
503 "cannot reach the queue"). So a NUL anywhere in the path or the query is refused up front
(no stored id or text holds one), an offset is capped far past any real page, and a queue row id
must be a positive 64-bit integer.
"""

# No ``from __future__ import annotations``: FastAPI evaluates the aliases below.

from typing import Annotated

from fastapi import HTTPException, Query, Request
from pydantic import Field

MAX_OFFSET = 1_000_000_000
"""Rows a page may skip at most: past any table an operator pages through, far under 2**63."""
MAX_ROW_ID = 2**63 - 1

Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET)]
RowId = Annotated[int, Field(ge=1, le=MAX_ROW_ID)]


def no_nul(request: Request) -> None:
    """Refuse a NUL in a path segment or a query value (422), before any handler sends it to SQL."""
    named = [*request.path_params.items(), *request.query_params.multi_items()]
    for name, value in named:
        if isinstance(value, str) and "\x00" in value:
            raise HTTPException(422, f"{name}: contains NUL (U+0000), which no stored id or text holds")


def row_id(text: str) -> int:
    """One queue row id of a comma-separated list (422 when it is not a positive 64-bit integer)."""
    try:
        value = int(text)
    except ValueError as exc:
        raise HTTPException(422, "ids are comma-separated row numbers") from exc
    if not 1 <= value <= MAX_ROW_ID:
        raise HTTPException(422, f"a row id is between 1 and {MAX_ROW_ID}")
    return value
