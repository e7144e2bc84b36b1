"""The long-term memory record's fields beyond DeerFlow's fact, and the rules for each.

The memory-layer design gives a memory a type, an importance, tags, a source kind, the user's
raw words and a structured form, and relations to other memories. A memory document carries them
as optional fact keys (``type``, ``importance``, ``tags``, ``sourceKind``, ``raw``,
``structured``, ``relations``). A fact that sets none of them reads exactly as DeerFlow's does:
providers write a key back only when its value differs from the default below, so documents,
exports and the DeerFlow adapters keep today's bytes for such a fact.

The strict checks here (``checked_*``) are what every entry point holds a record field to: the
extractor's reply, the fact helpers, the agent tools, MCP, HTTP and imports. They raise
``InvalidFactError`` naming the field and never quote the value.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from memstore.document import unstorable
from memstore.errors import InvalidFactError

MEMORY_TYPES = ("episodic", "semantic", "procedural", "preference", "profile")
TYPE_OF_CATEGORY = {
    "preference": "preference",
    "knowledge": "semantic",
    "context": "episodic",
    "behavior": "procedural",
    "goal": "profile",
    "correction": "semantic",
}
"""A fact's type when it states none: DeerFlow's category read as the design's type."""
FALLBACK_TYPE = "semantic"
"""The type of a fact whose category is none of DeerFlow's six."""

DEFAULT_IMPORTANCE = 0.5
"""A fact's importance when it states none: the middle, so ranking by it changes nothing."""

SOURCE_KINDS = (
    "explicit_user_input",
    "implicit_inference",
    "system_generated",
    "external_data",
    "corrected_memory",
)
DEFAULT_SOURCE_KIND = "implicit_inference"
"""What a fact that states no source kind is: what an extractor inferred (DeerFlow's facts)."""

RELATION_KINDS = ("related_to", "supersedes", "derived_from", "contradicts")

TYPE_KEY = "type"
IMPORTANCE_KEY = "importance"
TAGS_KEY = "tags"
SOURCE_KIND_KEY = "sourceKind"
RAW_KEY = "raw"
STRUCTURED_KEY = "structured"
RELATIONS_KEY = "relations"
RECORD_KEYS = (TYPE_KEY, IMPORTANCE_KEY, TAGS_KEY, SOURCE_KIND_KEY, RAW_KEY, STRUCTURED_KEY, RELATIONS_KEY)

MAX_TAGS = 16
MAX_TAG_CHARS = 64
MAX_RAW_CHARS = 4_000
"""The longest ``raw``: the user's words a memory came from, a few turns at most."""
MAX_STRUCTURED_CHARS = 4_000
"""The longest ``structured`` object, as compact JSON."""
MAX_STRUCTURED_NESTING = 4
"""How deep ``structured`` may nest (``{"tone": ["concise"]}`` is 2)."""
MAX_RELATIONS = 32
MAX_RELATION_TARGET_CHARS = 64

_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""NUL as JSON text escapes it (``\\u0000``), told apart from the six characters ``\\u0000`` typed."""
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
"""Control, format (bidi overrides), line and paragraph separators: nothing a label needs."""
_TAG = re.compile(r"[^\x00-\x1f\x7f,]+")
"""Any printable text without a comma: tags are labels, and a comma is the CLI's list separator."""


def default_type(category: str) -> str:
    """The type a fact of ``category`` has when it states none."""
    return TYPE_OF_CATEGORY.get(category, FALLBACK_TYPE)


def checked_type(value: object) -> str:
    if not isinstance(value, str) or value not in MEMORY_TYPES:
        raise InvalidFactError(TYPE_KEY, f"must be one of {', '.join(MEMORY_TYPES)}")
    return value


def checked_importance(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidFactError(IMPORTANCE_KEY, "must be a number between 0 and 1")
    if not 0 <= value <= 1:
        raise InvalidFactError(IMPORTANCE_KEY, "must be between 0 and 1")
    return float(value)


def checked_tag(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidFactError(TAGS_KEY, "each tag must be text")
    tag = value.strip()
    invisible = any(unicodedata.category(char) in _INVISIBLE for char in tag)
    if not 0 < len(tag) <= MAX_TAG_CHARS or invisible or not _TAG.fullmatch(tag) or unstorable(tag):
        raise InvalidFactError(
            TAGS_KEY, f"each tag must be 1 to {MAX_TAG_CHARS} printable characters without a comma"
        )
    return tag


def checked_tags(value: object) -> list[str]:
    """Distinct tags, stripped and sorted (a tag set has no order); at most ``MAX_TAGS``."""
    if not isinstance(value, list | tuple):
        raise InvalidFactError(TAGS_KEY, "must be a list of text")
    tags = sorted({checked_tag(item) for item in value})
    if len(tags) > MAX_TAGS:
        raise InvalidFactError(TAGS_KEY, f"at most {MAX_TAGS} tags")
    return tags


def checked_source_kind(value: object) -> str:
    if not isinstance(value, str) or value not in SOURCE_KINDS:
        raise InvalidFactError(SOURCE_KIND_KEY, f"must be one of {', '.join(SOURCE_KINDS)}")
    return value


def checked_raw(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidFactError(RAW_KEY, "must be text")
    if len(value) > MAX_RAW_CHARS:
        raise InvalidFactError(RAW_KEY, f"{len(value):,} characters, the limit is {MAX_RAW_CHARS:,}")
    problem = unstorable(value)
    if problem is not None:
        raise InvalidFactError(RAW_KEY, problem)
    return value


def checked_structured(value: object) -> dict[str, Any]:
    """A JSON object no deeper than ``MAX_STRUCTURED_NESTING`` and no longer than its cap."""
    if not isinstance(value, dict):
        raise InvalidFactError(STRUCTURED_KEY, "must be a JSON object")
    if nests_deeper(value, MAX_STRUCTURED_NESTING):
        raise InvalidFactError(STRUCTURED_KEY, f"nests deeper than {MAX_STRUCTURED_NESTING} levels")
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        raise InvalidFactError(STRUCTURED_KEY, "must hold only JSON values (no NaN)") from None
    if len(text) > MAX_STRUCTURED_CHARS:
        raise InvalidFactError(
            STRUCTURED_KEY, f"{len(text):,} characters as JSON, the limit is {MAX_STRUCTURED_CHARS:,}"
        )
    problem = unstorable(chr(0)) if _JSON_NUL.search(text) else unstorable(text)
    if problem is not None:
        raise InvalidFactError(STRUCTURED_KEY, problem)
    return value


def nests_deeper(value: object, levels: int) -> bool:
    """Whether ``value`` (itself one level) holds containers more than ``levels`` deep."""
    if not isinstance(value, dict | list):
        return False
    items = value.values() if isinstance(value, dict) else value
    return levels <= 0 or any(nests_deeper(item, levels - 1) for item in items)


def checked_relation(value: object) -> dict[str, str]:
    """``{"type": kind, "target": fact_id}``: the fact of the same scope this one relates to."""
    if not isinstance(value, Mapping) or set(value) != {"type", "target"}:
        raise InvalidFactError(RELATIONS_KEY, 'each relation must be {"type": ..., "target": ...}')
    kind, target = value["type"], value["target"]
    if kind not in RELATION_KINDS:
        raise InvalidFactError(RELATIONS_KEY, f"type must be one of {', '.join(RELATION_KINDS)}")
    if not isinstance(target, str) or not 0 < len(target) <= MAX_RELATION_TARGET_CHARS or unstorable(target):
        raise InvalidFactError(
            RELATIONS_KEY, f"target must be a fact id of 1 to {MAX_RELATION_TARGET_CHARS} characters"
        )
    return {"type": kind, "target": target}


def checked_relations(value: object) -> list[dict[str, str]]:
    """Distinct relations sorted by type and target; at most ``MAX_RELATIONS``."""
    if not isinstance(value, list | tuple):
        raise InvalidFactError(RELATIONS_KEY, "must be a list")
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for item in value:
        relation = checked_relation(item)
        seen.setdefault((relation["type"], relation["target"]), relation)
    if len(seen) > MAX_RELATIONS:
        raise InvalidFactError(RELATIONS_KEY, f"at most {MAX_RELATIONS} relations")
    return [seen[key] for key in sorted(seen)]


_CHECKS = {
    TYPE_KEY: checked_type,
    IMPORTANCE_KEY: checked_importance,
    TAGS_KEY: checked_tags,
    SOURCE_KIND_KEY: checked_source_kind,
    RAW_KEY: checked_raw,
    STRUCTURED_KEY: checked_structured,
    RELATIONS_KEY: checked_relations,
}


def checked_record_fields(fact: Mapping[str, Any]) -> dict[str, Any]:
    """The record keys ``fact`` carries, each checked; ``InvalidFactError`` on the first bad one."""
    return {key: _CHECKS[key](fact[key]) for key in RECORD_KEYS if key in fact}
