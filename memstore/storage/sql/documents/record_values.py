"""A fact's memory-record columns (``memstore.record``) as the SQL provider stores them.

Invalid values in a document are not refused here: the column takes the default and the codec
keeps the given value verbatim in ``extra``, as it does for any known key a column cannot hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memstore.errors import InvalidFactError
from memstore.record import (
    DEFAULT_IMPORTANCE,
    DEFAULT_SOURCE_KIND,
    RAW_KEY,
    RECORD_KEYS,
    RELATIONS_KEY,
    STRUCTURED_KEY,
    checked_importance,
    checked_raw,
    checked_relations,
    checked_source_kind,
    checked_structured,
    checked_tags,
    checked_type,
    default_type,
)
from memstore.storage.sql.documents.json_values import canonical_json, copy_json

Relations = tuple[tuple[str, str], ...]
"""``(kind, target fact id)`` pairs, sorted."""


@dataclass(frozen=True, slots=True, eq=False)
class Record:
    """A fact's memory-record columns (``memstore.record``), as stored."""

    memory_type: str
    importance: float = DEFAULT_IMPORTANCE
    source_kind: str = DEFAULT_SOURCE_KIND
    raw: str | None = None
    structured: dict[str, Any] | None = None
    tags: tuple[str, ...] = ()
    relations: Relations = ()

    @classmethod
    def default(cls, category: str) -> Record:
        return cls(default_type(category))

    def is_default_for(self, category: str) -> bool:
        return self.same_as(Record.default(category))

    def same_as(self, other: Record) -> bool:
        return (
            self.memory_type == other.memory_type
            and self.importance == other.importance
            and self.source_kind == other.source_kind
            and self.raw == other.raw
            and self.tags == other.tags
            and self.relations == other.relations
            and (self.structured is None) == (other.structured is None)
            and canonical_json(self.structured or {}) == canonical_json(other.structured or {})
        )

    def document_keys(self, category: str) -> dict[str, Any]:
        """The record keys a document shows: only those that differ from the defaults."""
        keys: dict[str, Any] = {}
        if self.memory_type != default_type(category):
            keys["type"] = self.memory_type
        if self.importance != DEFAULT_IMPORTANCE:
            keys["importance"] = self.importance
        if self.tags:
            keys["tags"] = list(self.tags)
        if self.source_kind != DEFAULT_SOURCE_KIND:
            keys["sourceKind"] = self.source_kind
        if self.raw is not None:
            keys[RAW_KEY] = self.raw
        if self.structured is not None:
            keys[STRUCTURED_KEY] = copy_json(self.structured)
        if self.relations:
            keys[RELATIONS_KEY] = [{"type": kind, "target": target} for kind, target in self.relations]
        return keys


def _lenient(check: Any, given: Mapping[str, Any], key: str, default: Any) -> Any:
    """``check(given[key])``, or ``default`` when absent or invalid: the codec keeps what it cannot
    store in a column verbatim in ``extra`` (``_with_overrides``), as it does for a long category."""
    if key not in given:
        return default
    try:
        return check(given[key])
    except InvalidFactError:
        return default


def encode_record(given: Mapping[str, Any], category: str) -> Record | None:
    """The record columns of a document fact; None when every one is at its default."""
    if not any(key in given for key in RECORD_KEYS):
        return None
    importance = _lenient(checked_importance, given, "importance", DEFAULT_IMPORTANCE)
    relations = _lenient(checked_relations, given, RELATIONS_KEY, [])
    record = Record(
        memory_type=_lenient(checked_type, given, "type", default_type(category)),
        # Six decimals: the cold load reads it back from JSON text exactly; finer is kept in extra.
        importance=round(importance, 6),
        source_kind=_lenient(checked_source_kind, given, "sourceKind", DEFAULT_SOURCE_KIND),
        raw=_lenient(checked_raw, given, RAW_KEY, None),
        structured=_lenient(checked_structured, given, STRUCTURED_KEY, None),
        tags=tuple(_lenient(checked_tags, given, "tags", [])),
        relations=tuple((item["type"], item["target"]) for item in relations),
    )
    return None if record.is_default_for(category) else record
