"""The record fields an extracted fact carries (``memstore.record``): read from a reply, written to a fact.

Reading (``reply_fields``) holds each optional key of a reply's new fact to the strict check every
entry point uses (``checked_*``), so a bad value (a type that is no type, an importance of 2, 17
tags, a ``raw`` over its cap, a ``structured`` nested too deep) raises ``InvalidFactError`` and the
parser drops the fact the way it drops one with a bad confidence. A key that is absent, ``null``
or empty (``""``, ``[]``, ``{}``) means the default: models write ``null`` for "none".

Source kind: the extractor may say ``explicit_user_input`` (the user said it) or
``implicit_inference`` (the default); the other kinds are not the extractor's to claim
(``system_generated``, ``external_data``), and a fact of category ``correction`` is always
``corrected_memory``, whatever the reply says. ``replaces`` names existing facts the new fact
corrects or replaces: the parser removes them, and the stored fact records a ``supersedes``
relation to each one that was in the scope.

Writing (``stored_fields``) sets a key only when it differs from the record's default, so a fact
the extractor said nothing more about is stored exactly as before this field set existed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from memstore.errors import InvalidFactError
from memstore.record import (
    DEFAULT_IMPORTANCE,
    DEFAULT_SOURCE_KIND,
    IMPORTANCE_KEY,
    MAX_RELATIONS,
    RAW_KEY,
    RELATIONS_KEY,
    SOURCE_KIND_KEY,
    STRUCTURED_KEY,
    TAGS_KEY,
    TYPE_KEY,
    checked_importance,
    checked_raw,
    checked_relation,
    checked_source_kind,
    checked_structured,
    checked_tags,
    checked_type,
    default_type,
)

CORRECTION_CATEGORY = "correction"
CORRECTED_MEMORY = "corrected_memory"
EXTRACTOR_SOURCE_KINDS = ("explicit_user_input", "implicit_inference")
"""The source kinds an extractor may state for a fact it read from a conversation."""
REPLACES_KEY = "replaces"
SUPERSEDES = "supersedes"

_CHECKS: tuple[tuple[str, Callable[[object], Any]], ...] = (
    (TYPE_KEY, checked_type),
    (IMPORTANCE_KEY, checked_importance),
    (TAGS_KEY, checked_tags),
    (RAW_KEY, checked_raw),
    (STRUCTURED_KEY, checked_structured),
)


def _replaced_ids(value: object) -> list[str]:
    """Distinct fact ids, each a valid relation target, at most ``MAX_RELATIONS``."""
    if not isinstance(value, list | tuple):
        raise InvalidFactError(REPLACES_KEY, "must be a list of fact ids")
    targets = (checked_relation({"type": SUPERSEDES, "target": item})["target"] for item in value)
    ids = list(dict.fromkeys(targets))
    if len(ids) > MAX_RELATIONS:
        raise InvalidFactError(REPLACES_KEY, f"at most {MAX_RELATIONS} fact ids")
    return ids


def reply_fields(fact: Mapping[str, Any], category: str) -> dict[str, Any]:
    """The record fields (and ``replaces``) a reply's fact states, checked; see the module doc."""
    fields: dict[str, Any] = {}
    for key, check in _CHECKS:
        value = fact.get(key)
        if isinstance(value, str) and key == RAW_KEY:
            value = value.strip()
        if not _absent(value):
            fields[key] = check(value)
    kind = fact.get(SOURCE_KIND_KEY)
    if not _absent(kind):
        if checked_source_kind(kind) not in EXTRACTOR_SOURCE_KINDS:
            raise InvalidFactError(SOURCE_KIND_KEY, f"must be one of {', '.join(EXTRACTOR_SOURCE_KINDS)}")
        fields[SOURCE_KIND_KEY] = kind
    if category == CORRECTION_CATEGORY:
        fields[SOURCE_KIND_KEY] = CORRECTED_MEMORY
    replaced = fact.get(REPLACES_KEY)
    if not _absent(replaced):
        fields[REPLACES_KEY] = _replaced_ids(replaced)
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
