"""The record fields an extracted fact carries (``memstore.record``): read from a reply, written to a fact.

Reading (``reply_fields``) is lenient, as the parser is with a fact's confidence: the fail-closed
core of a reply is a fact's content, category and confidence (``parser.py``), and a slip in an
optional key costs that key, never the fact. Each key is read on its own:

- ``type``: matched case-insensitively against ``MEMORY_TYPES``; anything else is dropped (the
  category's default type applies);
- ``importance``: a number or a numeric string, clamped to [0, 1]; anything else is dropped (the
  default 0.5 applies);
- ``tags``: a list; each tag that fails ``checked_tag`` is dropped, and of the distinct rest the
  first ``MAX_TAGS`` are kept (sorted, as a tag set has no order); anything but a list is dropped;
- ``raw``: text, stripped, cut at ``MAX_RAW_CHARS`` characters when longer; text the store
  cannot keep (a NUL, a lone surrogate) or anything but text is dropped;
- ``structured``: dropped whole unless it passes ``checked_structured``;
- ``sourceKind``: matched case-insensitively; the extractor may say ``explicit_user_input`` (the
  user said it) or ``implicit_inference`` (the default), and any other value is dropped (the other
  kinds are not the extractor's to claim); a fact of category ``correction`` is always
  ``corrected_memory``, whatever the reply says;
- ``replaces``: the ids of stored facts the new fact corrects or replaces; dropped whole unless it
  is a list of at most ``MAX_RELATIONS`` valid ids (a malformed list is not trusted to delete
  anything). The apply step removes them only when the new fact is stored (``apply.py``).

Each key dropped or changed is logged (INFO when dropped, DEBUG when normalised), naming the key
and never quoting the value. A key that is absent, ``null`` or empty (``""``, ``[]``, ``{}``)
means the default: models write ``null`` for "none".

Writing (``stored_fields``) sets a key only when it differs from the record's default, so a fact
the extractor said nothing more about is stored exactly as before this field set existed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from memstore.document import unstorable
from memstore.errors import InvalidFactError
from memstore.record import (
    DEFAULT_IMPORTANCE,
    DEFAULT_SOURCE_KIND,
    IMPORTANCE_KEY,
    MAX_RAW_CHARS,
    MAX_RELATIONS,
    MAX_TAGS,
    MEMORY_TYPES,
    RAW_KEY,
    RELATIONS_KEY,
    SOURCE_KIND_KEY,
    STRUCTURED_KEY,
    TAGS_KEY,
    TYPE_KEY,
    checked_relation,
    checked_structured,
    checked_tag,
    default_type,
)

logger = logging.getLogger(__name__)

CORRECTION_CATEGORY = "correction"
CORRECTED_MEMORY = "corrected_memory"
EXTRACTOR_SOURCE_KINDS = ("explicit_user_input", "implicit_inference")
"""The source kinds an extractor may state for a fact it read from a conversation."""
REPLACES_KEY = "replaces"
SUPERSEDES = "supersedes"


def finite_number(value: object) -> float | None:
    """A finite float from a number or a numeric string; ``None`` for anything else (``True`` too)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    elif isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float, e.g. 10**400
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _dropped(key: str, why: str) -> None:
    logger.info("extractor reply: a new fact's %s was dropped (%s); the fact is kept", key, why)


def _normalised(key: str, how: str) -> None:
    logger.debug("extractor reply: a new fact's %s was %s", key, how)


def _choice(key: str, value: object, choices: tuple[str, ...]) -> str | None:
    word = value.strip().lower() if isinstance(value, str) else None
    if word not in choices:
        _dropped(key, f"not one of {', '.join(choices)}")
        return None
    if word != value:
        _normalised(key, "matched case-insensitively")
    return word


def _type(value: object) -> str | None:
    return _choice(TYPE_KEY, value, MEMORY_TYPES)


def _importance(value: object) -> float | None:
    number = finite_number(value)
    if number is None:
        _dropped(IMPORTANCE_KEY, "not a finite number")
        return None
    if isinstance(value, str):
        _normalised(IMPORTANCE_KEY, "read from text")
    clamped = min(1.0, max(0.0, number))
    if clamped != number:
        _normalised(IMPORTANCE_KEY, "clamped to [0, 1]")
    return clamped


def _tags(value: object) -> list[str] | None:
    if not isinstance(value, list | tuple):
        _dropped(TAGS_KEY, "not a list")
        return None
    tags: dict[str, None] = {}
    invalid = 0
    for item in value:
        try:
            tags[checked_tag(item)] = None
        except InvalidFactError:
            invalid += 1
    if invalid:
        _normalised(TAGS_KEY, f"left without {invalid} invalid tag(s)")
    if len(tags) > MAX_TAGS:
        _normalised(TAGS_KEY, f"cut to the first {MAX_TAGS} of {len(tags)}")
    return sorted(list(tags)[:MAX_TAGS]) or None


def _raw(value: object) -> str | None:
    if not isinstance(value, str):
        _dropped(RAW_KEY, "not text")
        return None
    text = value.strip()
    if len(text) > MAX_RAW_CHARS:
        _normalised(RAW_KEY, f"cut from {len(text):,} to {MAX_RAW_CHARS:,} characters")
        text = text[:MAX_RAW_CHARS].rstrip()
    problem = unstorable(text)
    if problem is not None:
        _dropped(RAW_KEY, problem)
        return None
    return text or None


def _structured(value: object) -> dict[str, Any] | None:
    try:
        return checked_structured(value)
    except InvalidFactError as exc:
        _dropped(STRUCTURED_KEY, exc.message.partition(": ")[2])
        return None


def _source_kind(value: object) -> str | None:
    return _choice(SOURCE_KIND_KEY, value, EXTRACTOR_SOURCE_KINDS)


def _replaced_ids(value: object) -> list[str] | None:
    """Distinct fact ids, each a valid relation target, at most ``MAX_RELATIONS``; else ``None``."""
    if not isinstance(value, list | tuple):
        _dropped(REPLACES_KEY, "not a list of fact ids")
        return None
    try:
        ids = list(
            dict.fromkeys(checked_relation({"type": SUPERSEDES, "target": i})["target"] for i in value)
        )
    except InvalidFactError:
        _dropped(REPLACES_KEY, "an entry is not a fact id")
        return None
    if len(ids) > MAX_RELATIONS:
        _dropped(REPLACES_KEY, f"more than {MAX_RELATIONS} fact ids")
        return None
    return ids


_READERS: tuple[tuple[str, Callable[[object], Any]], ...] = (
    (TYPE_KEY, _type),
    (IMPORTANCE_KEY, _importance),
    (TAGS_KEY, _tags),
    (RAW_KEY, _raw),
    (STRUCTURED_KEY, _structured),
    (SOURCE_KIND_KEY, _source_kind),
    (REPLACES_KEY, _replaced_ids),
)


def reply_fields(fact: Mapping[str, Any], category: str) -> dict[str, Any]:
    """The record fields (and ``replaces``) a reply's fact states, read leniently; see the module doc."""
    fields: dict[str, Any] = {}
    for key, read in _READERS:
        value = fact.get(key)
        if not _absent(value) and (value := read(value)) is not None:
            fields[key] = value
    if category == CORRECTION_CATEGORY:
        fields[SOURCE_KIND_KEY] = CORRECTED_MEMORY
    return fields


def _absent(value: object) -> bool:
    """``null`` or empty: what a model writes for "none"."""
    return value is None or (isinstance(value, str | list | dict) and not value)


def effective_importance(fact: Mapping[str, Any]) -> float:
    """The importance a fact ranks and filters by: its own, or the default."""
    value = fact.get(IMPORTANCE_KEY)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return DEFAULT_IMPORTANCE
    return float(value)


def stored_fields(fact: Mapping[str, Any], category: str) -> dict[str, Any]:
    """The record keys to write on a stored fact of ``category``: those that differ from the default."""
    fields: dict[str, Any] = {}
    if fact.get(TYPE_KEY, default_type(category)) != default_type(category):
        fields[TYPE_KEY] = fact[TYPE_KEY]
    if effective_importance(fact) != DEFAULT_IMPORTANCE:
        fields[IMPORTANCE_KEY] = effective_importance(fact)
    if fact.get(TAGS_KEY):
        fields[TAGS_KEY] = list(fact[TAGS_KEY])
    if fact.get(SOURCE_KIND_KEY, DEFAULT_SOURCE_KIND) != DEFAULT_SOURCE_KIND:
        fields[SOURCE_KIND_KEY] = fact[SOURCE_KIND_KEY]
    for key in (RAW_KEY, STRUCTURED_KEY):
        if fact.get(key):
            fields[key] = fact[key]
    return fields


def with_relations(fact: dict[str, Any], relations: list[dict[str, str]]) -> None:
    """Add ``relations`` to ``fact`` (in place), each once, sorted by type and target as the store
    reads them back (``checked_relations``), keeping at most ``MAX_RELATIONS``."""
    if not relations:
        return
    existing = fact.get(RELATIONS_KEY)
    merged = [*(existing if isinstance(existing, list) else []), *relations]
    distinct: dict[tuple[str, str], dict[str, Any]] = {}
    for item in merged:
        if isinstance(item, dict):
            distinct.setdefault((str(item.get("type")), str(item.get("target"))), item)
    fact[RELATIONS_KEY] = [distinct[key] for key in sorted(distinct)][:MAX_RELATIONS]
