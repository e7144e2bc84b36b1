"""JSON-shaped values as the SQL provider copies, compares and stores them: fast deep copies of
documents, type-strict equality, the canonical text of an ``extra`` column, and the exact JSON
text of a document's parts (``exact_text``)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

from memstore.document import unstorable
from memstore.errors import MalformedDocumentError

_SCALARS = frozenset({str, int, float, bool, type(None)})
_EXACT_OPTIONS = (
    orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def exact_text(value: object) -> bytes | None:
    """``value`` as JSON text that ``orjson.loads`` gives back exactly, or None when there is none.

    orjson writes every float so it reads back bit for bit, and refuses an integer beyond 64 bits
    (which its ``loads`` would turn into a float): such a value (and anything but plain JSON types)
    has no exact text here, and its reader falls back to ``json``.
    """
    try:
        return orjson.dumps(value, option=_EXACT_OPTIONS)
    except TypeError:
        return None


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data, several times faster than ``copy.deepcopy``.

    Scalars (nearly every value in a document) are taken as they are, without a call per value.
    """
    if isinstance(value, dict):
        return {key: item if type(item) in _SCALARS else copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [item if type(item) in _SCALARS else copy_json(item) for item in value]
    return value


def jsonb_stable(value: object) -> bool:
    """Whether PostgreSQL's JSONB gives ``value`` back as it is (an ``extra`` column is JSONB there):
    objects with their keys already in JSONB's order (shorter first, then bytewise) and no float
    it rewrites (``-0.0`` loses its sign, ``1e+16`` comes back an integer). On PostgreSQL a document
    holding anything else is not stored as a scope's snapshot (``stored.py``): its rows read otherwise."""
    if value == {}:
        return True  # nearly every fact
    if isinstance(value, dict):
        keys = [key.encode() for key in value]
        ordered = keys == sorted(keys, key=lambda key: (len(key), key))
        return ordered and all(map(jsonb_stable, value.values()))
    if isinstance(value, list):
        return all(map(jsonb_stable, value))
    if isinstance(value, float):
        return "e+" not in repr(value) and math.copysign(1.0, value) > 0
    return True


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
