"""The memory-record fields of a manual create or update (``memstore.record``), checked and applied.

The helpers, the agent tools, MCP and HTTP name them ``memory_type``, ``importance``, ``tags``,
``source_kind``, ``raw`` and ``structured``; in the document they are the keys ``type``,
``importance``, ``tags``, ``sourceKind``, ``raw`` and ``structured``. A field left out (``None``)
is not touched. A field set to its default is stored as no key at all, as the SQL provider stores
it, so a fact that sets nothing beyond DeerFlow's fields keeps DeerFlow's shape on every provider:
importance 0.5, no tags, source kind ``implicit_inference``, the type its category maps to
(``record.TYPE_OF_CATEGORY``), and an empty ``raw`` (``""``) or ``structured`` (``{}``), which
remove the key. A manual create sets no ``sourceKind`` unless one is given: it reads as the
default, ``implicit_inference``, like any fact that names none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from memstore.errors import InvalidFactError
from memstore.record import (
    DEFAULT_IMPORTANCE,
    DEFAULT_SOURCE_KIND,
    IMPORTANCE_KEY,
    RAW_KEY,
    SOURCE_KIND_KEY,
    STRUCTURED_KEY,
    TAGS_KEY,
    TYPE_KEY,
    checked_importance,
    checked_raw,
    checked_source_kind,
    checked_structured,
    checked_tags,
    checked_type,
    default_type,
)

Fact = dict[str, Any]
MemoryType = Literal["episodic", "semantic", "procedural", "preference", "profile"]
SourceKind = Literal[
    "explicit_user_input", "implicit_inference", "system_generated", "external_data", "corrected_memory"
]
"""``record.MEMORY_TYPES`` and ``record.SOURCE_KINDS`` as types, for the tool, MCP and HTTP
schemas (a unit test keeps them equal)."""

_PARAMETERS = {
    TYPE_KEY: "memory_type",
    IMPORTANCE_KEY: "importance",
    TAGS_KEY: "tags",
    SOURCE_KIND_KEY: "source_kind",
    RAW_KEY: "raw",
    STRUCTURED_KEY: "structured",
}
"""Document key to the parameter that sets it, for error messages that name what was sent."""


@dataclass(frozen=True)
class RecordFields:
    """Checked record fields of one edit: document key to value, only those the caller gave."""

    values: Mapping[str, Any]

    @classmethod
    def of(
        cls,
        *,
        memory_type: str | None = None,
        importance: float | None = None,
        tags: Iterable[str] | None = None,
        source_kind: str | None = None,
        raw: str | None = None,
        structured: Mapping[str, Any] | None = None,
    ) -> RecordFields:
        """Each given field checked (``InvalidFactError`` naming the parameter); tags sorted, as
        the SQL provider keeps them in no order."""
        given: dict[str, tuple[object, Callable[[object], Any]]] = {
            TYPE_KEY: (memory_type, checked_type),
            IMPORTANCE_KEY: (importance, checked_importance),
            TAGS_KEY: (None if tags is None else _listed(tags), checked_tags),
            SOURCE_KIND_KEY: (source_kind, checked_source_kind),
            RAW_KEY: (raw, checked_raw),
            STRUCTURED_KEY: (
                dict(structured) if isinstance(structured, Mapping) else structured,
                checked_structured,
            ),
        }
        values: dict[str, Any] = {}
        for key, (value, check) in given.items():
            if value is None:
                continue
            try:
                values[key] = check(value)
            except InvalidFactError as exc:
                raise InvalidFactError(_PARAMETERS[key], exc.message.partition(": ")[2]) from None
        if TAGS_KEY in values:
            values[TAGS_KEY] = sorted(values[TAGS_KEY])
        return cls(values)

    def applied_to(self, fact: Fact) -> Fact:
        """``fact`` with these fields set, a default one as no key (checked against the fact's
        category as it will be stored)."""
        updated = dict(fact)
        for key, value in self.values.items():
            if value == _default(updated, key):
                updated.pop(key, None)
            else:
                updated[key] = value
        return updated

    def held_by(self, fact: Mapping[str, Any]) -> bool:
        """Whether a stored ``fact`` reads with these fields' values (a missing key as its default)."""
        return all(fact.get(key, _default(fact, key)) == value for key, value in self.values.items())


def _listed(tags: Iterable[str]) -> object:
    # A lone string stays one, for checked_tags to refuse: split, it would tag each character.
    return tags if isinstance(tags, str) else list(tags)


def _default(fact: Mapping[str, Any], key: str) -> object:
    """The value ``key`` reads as when ``fact`` has none (``""`` and ``{}`` for raw and structured)."""
    if key == TYPE_KEY:
        category = fact.get("category")
        return default_type(category if isinstance(category, str) else "")
    return {
        IMPORTANCE_KEY: DEFAULT_IMPORTANCE,
        TAGS_KEY: [],
        SOURCE_KIND_KEY: DEFAULT_SOURCE_KIND,
        RAW_KEY: "",
        STRUCTURED_KEY: {},
    }[key]
