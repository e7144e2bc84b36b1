"""How deep the JSON a provider stores may nest; both providers refuse a document past it.

Facts and sections may carry unknown keys with any JSON, which providers keep. Nesting is what
breaks readers: pydantic stops serialising at 255 levels (so one deep fact made every later
API call for its user fail), and Python's ``json`` at about a thousand. A fact or a section, its
own object counted as one level, may nest ``MAX_NESTING`` levels; real documents use two or three.
"""

from __future__ import annotations

from typing import Any

MAX_NESTING = 32
_CONTAINERS = (dict, list)
DOCUMENT_LEVELS = 2
"""The levels above a fact or section: the document, then ``facts`` (or ``user``, ``history``)."""


def nests_deeper(value: Any, levels: int) -> bool:
    """Whether ``value`` holds objects or lists more than ``levels`` deep; looks no deeper than that.

    Bounded recursion, so a value nested a million levels is answered without a RecursionError.
    """
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return False
    # Scalars are skipped without a call: nearly every value of a fact is one.
    return levels == 0 or any(
        nests_deeper(item, levels - 1) for item in items if isinstance(item, _CONTAINERS)
    )


def document_too_deep(document: Any) -> bool:
    """Whether any part of a document (a fact, a section, an unknown key) passes ``MAX_NESTING``."""
    return nests_deeper(document, MAX_NESTING + DOCUMENT_LEVELS)
