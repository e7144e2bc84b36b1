"""JSON-shaped values as the SQL provider copies, compares and stores them: fast deep copies of
documents, type-strict equality, the canonical text of an ``extra`` column."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from memstore.document import unstorable
from memstore.errors import MalformedDocumentError

_SCALARS = frozenset({str, int, float, bool, type(None)})


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data, several times faster than ``copy.deepcopy``.

    Scalars (nearly every value in a document) are taken as they are, without a call per value.
    """
    if isinstance(value, dict):
        return {key: item if type(item) in _SCALARS else copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [item if type(item) in _SCALARS else copy_json(item) for item in value]
    return value


def json_object(value: object) -> dict[str, Any]:
    """An ``extra`` column's value as a dict; anything else (NULL, a stray scalar) reads as empty."""
    return value if isinstance(value, dict) else {}


_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""``\\u0000`` in JSON text (an escaped backslash before ``u0000`` is not one): NUL in a value."""


def canonical_json(value: object) -> str:
    """Strict JSON (no NaN), sorted: comparable across reads and accepted by every backend."""
    if value == {}:
        return "{}"  # the common case, on the hot path of every save
    try:
        text = storable(json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise MalformedDocumentError(f"value is not JSON-serialisable: {exc}") from exc
    if _JSON_NUL.search(text):
        raise MalformedDocumentError(f"text {unstorable(chr(0))}")
    return text


def storable(text: str) -> str:
    """``text`` if every dialect can store it: PostgreSQL takes no NUL in text or JSON, and no
    driver sends a lone surrogate. Refused here, before any SQL, so both dialects agree."""
    problem = unstorable(text)
    if problem is not None:
        raise MalformedDocumentError(f"text {problem}")
    return text


def same_json(left: object, right: object) -> bool:
    """Type-strict equality of JSON values: ``1``, ``1.0`` and ``True`` differ, so do ``0.0`` and ``-0.0``."""
    return left == right and same_types(left, right)


def same_types(left: object, right: object) -> bool:
    """Given ``left == right``: whether they are also the same JSON (which ``==`` does not check)."""
    if left is right:
        return True
    if type(left) is not type(right):
        return False
    if isinstance(left, float) and isinstance(right, float):
        return math.copysign(1.0, left) == math.copysign(1.0, right)
    if isinstance(left, dict) and isinstance(right, dict):
        return all(same_types(item, right[key]) for key, item in left.items())
    if isinstance(left, list) and isinstance(right, list):
        return all(same_types(a, b) for a, b in zip(left, right, strict=True))
    return True
