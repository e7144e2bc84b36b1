"""Row <-> document conversion for the SQL provider, lossless for facts and sections.

Known keys live in real columns so SQL can filter and sort on them. Whatever the columns cannot
reproduce exactly -- a missing key, a ``createdAt`` like ``"2026-07-14"`` or with a ``+08:00``
offset, a non-string ``source``, an integer confidence -- is kept verbatim in the row's ``extra``
JSON under the reserved key ``$memstore`` (``{"raw": {key: value}, "absent": [key, ...]}``), so
``load(save(doc))`` gives back the same fact and section values. Unknown keys are kept flat in
``extra``, where a DBA can query them, up to ``limits.MAX_NESTING`` levels deep: a fact or
section nested deeper is refused (``MalformedDocumentError``), because no reader could serialise it.

One deliberate normalisation: a confidence that is not a finite number in [0, 1] (a string,
null, a bool, NaN, 1.5) is stored and loaded as ``coerce_confidence(value)``, because the column
carries a CHECK constraint and every reader coerces it anyway.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from operator import attrgetter
from typing import Any, NamedTuple

from memstore.document import (
    DEFAULT_CATEGORY,
    SECTION_GROUPS,
    coerce_confidence,
    fact_content_key,
    format_timestamp,
    new_fact_id,
    parse_timestamp,
)
from memstore.errors import MalformedDocumentError
from memstore.record import RECORD_KEYS
from memstore.storage.limits import MAX_NESTING, nests_deeper
from memstore.storage.sql.documents.grants import PRIVATE, Grants, fact_access
from memstore.storage.sql.documents.json_values import (
    canonical_json,
    copy_json,
    exact_text,
    jsonb_stable,
    same_json,
    same_types,
    storable,
)
from memstore.storage.sql.documents.record_values import Record, Relations, encode_record

__all__ = ["Record", "Relations"]

RESERVED_KEY = "$memstore"
_SETS = ("tags", "relations")
INCARNATION_KEY = "incarnation"
FACT_FIELDS = (
    "id",
    "content",
    "category",
    "confidence",
    "createdAt",
    "source",
    "sourceError",
    "visibility",
    "allowedUsers",
    "allowedRoles",
    *RECORD_KEYS,
)
SECTION_FIELDS = ("summary", "updatedAt")
MAX_FACT_ID = 64
MAX_CATEGORY = 64
MAX_SOURCE = 255
MAX_VERSION = 16
_MISSING = object()


@dataclass(frozen=True, slots=True, eq=False)
class FactValues:
    """A fact as stored, minus bookkeeping (revisions, position)."""

    fact_id: str
    content: str
    category: str
    confidence: float
    created_at: datetime | None
    source: str | None
    source_error: str | None
    extra: dict[str, Any]
    visibility: str = PRIVATE
    grants: Grants = ()
    record: Record | None = None
    """The memory record's fields; None when all are at their defaults (most facts)."""

    @property
    def content_key(self) -> str:
        return fact_content_key(self.content)

    @property
    def fields(self) -> Record:
        return self.record if self.record is not None else Record.default(self.category)

    def same_as(self, other: FactValues) -> bool:
        """Type-strict equality: ``{"x": 1}`` and ``{"x": True}`` in ``extra`` differ."""
        return (
            self.fact_id == other.fact_id
            and self.content == other.content
            and self.category == other.category
            and self.confidence == other.confidence
            and self.created_at == other.created_at
            and self.source == other.source
            and self.source_error == other.source_error
            and self.visibility == other.visibility
            and self.grants == other.grants
            and self.fields.same_as(other.fields)
            and canonical_json(self.extra) == canonical_json(other.extra)
        )


@dataclass(frozen=True, slots=True, eq=False)
class SectionValues:
    summary: str
    updated_at: datetime | None
    extra: dict[str, Any]

    def same_as(self, other: SectionValues) -> bool:
        return (
            self.summary == other.summary
            and self.updated_at == other.updated_at
            and canonical_json(self.extra) == canonical_json(other.extra)
        )


EMPTY_SECTION = SectionValues("", None, {})


@dataclass(frozen=True, slots=True)
class IncomingFact:
    """A validated document fact; ``generated_id`` marks ids we made up (safe to re-roll)."""

    values: FactValues
    generated_id: bool


_CONFIDENCE_ONLY = ("confidence",)
_FACT_OF = attrgetter("fact")


class KnownFact(NamedTuple):
    """A stored fact in document form and the values it encodes to; an equal document fact reuses them.

    ``text`` is the document form's exact JSON (``json_values.exact_text``; None when there is none),
    joined into the scope's snapshot text by each save that keeps the fact. ``stable``: its ``extra``
    reads back as it is from PostgreSQL's JSONB (``json_values.jsonb_stable``), else no snapshot row there.
    """

    raw: dict[str, Any]
    fact: IncomingFact
    lax_keys: tuple[str, ...]
    text: bytes | None
    stable: bool

    @classmethod
    def of(cls, values: FactValues) -> KnownFact:
        raw = decode_fact(values)
        # Without ``extra``, the document is the columns: confidence is the only non-string value.
        lax_keys = _lax_keys(raw) if values.extra else _CONFIDENCE_ONLY
        fact = IncomingFact(values, generated_id=False)
        return cls(raw, fact, lax_keys, exact_text(raw), jsonb_stable(values.extra))

    def matches(self, raw: Mapping[str, Any]) -> bool:
        """``same_json(raw, self.raw)``, checking types only where ``==`` is lax: once per fact per save."""
        stored = self.raw
        if raw != stored:
            return False
        for key in self.lax_keys:  # a loop: twice as fast as all() over a generator, here
            value, stored_value = raw[key], stored[key]
            if value is not stored_value and not same_types(value, stored_value):
                return False
        return True


class KnownSection(NamedTuple):
    raw: dict[str, Any]
    values: SectionValues


@dataclass(frozen=True, slots=True)
class IncomingDocument:
    """What a save asks for. ``facts is None`` means the document carried no ``facts`` key.

    ``incarnation`` is the scope row the document was loaded from (``cache.incarnation``); it
    counts only with a ``revision``, since a document without one replaces the scope.
    """

    revision: int | None
    incarnation: str | None
    version: str | None
    facts: list[IncomingFact] | None
    sections: dict[str, SectionValues]
    kept: int = 0
    """How many of ``facts`` lead it unchanged and in order: the known facts it was parsed against."""


def _lax_keys(raw: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys whose values ``==`` alone does not pin down: anything but strings and null."""
    return tuple(key for key, value in raw.items() if value is not None and type(value) is not str)


def _with_overrides(
    base: Mapping[str, object], given: Mapping[str, Any], fields: tuple[str, ...]
) -> dict[str, Any]:
    """``given``'s unknown keys plus a ``$memstore`` entry for known keys the columns cannot reproduce.

    A private copy: stored and cached values must not change when the caller edits its document.
    Refuses an object nested deeper than ``limits.MAX_NESTING``, which readers could not serialise.
    """
    if nests_deeper(given, MAX_NESTING):
        raise MalformedDocumentError(f"JSON nested deeper than {MAX_NESTING} levels cannot be stored")
    extra = {key: value for key, value in given.items() if key not in fields and key != RESERVED_KEY}
    raw = {
        key: given[key]
        for key in fields
        if key in given and not same_json(base.get(key, _MISSING), given[key])
    }
    if RESERVED_KEY in given:
        raw[RESERVED_KEY] = given[RESERVED_KEY]
    absent = [key for key in fields if key in base and key not in given]
    if raw or absent:
        meta: dict[str, Any] = {}
        if raw:
            meta["raw"] = raw
        if absent:
            meta["absent"] = absent
        extra[RESERVED_KEY] = meta
    return copy_json(extra) if extra else extra


def _apply_overrides(document: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if key != RESERVED_KEY:
            document[key] = value
    meta = extra.get(RESERVED_KEY)
    if isinstance(meta, dict):
        for key in meta.get("absent", ()):
            document.pop(key, None)
        document.update(meta.get("raw", {}))
    return document


def _fact_base(values: FactValues) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": values.fact_id,
        "content": values.content,
        "category": values.category,
        "confidence": values.confidence,
    }
    if values.created_at is not None:
        base["createdAt"] = format_timestamp(values.created_at)
    if values.source is not None:
        base["source"] = values.source
    if values.source_error is not None:
        base["sourceError"] = values.source_error
    if values.visibility != PRIVATE:
        base["visibility"] = values.visibility
    for kind, key in (("user", "allowedUsers"), ("role", "allowedRoles")):
        names = [grantee for grantee_kind, grantee in values.grants if grantee_kind == kind]
        if names:
            base[key] = names
    if values.record is not None:
        base.update(values.record.document_keys(values.category))
    return base


def _is_conforming_confidence(raw: object) -> bool:
    return isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw) and 0 <= raw <= 1


def encode_fact(raw: Mapping[str, Any], fact_id: str) -> FactValues:
    """Column values for a validated document fact (``content`` already checked)."""
    given = dict(raw)
    given["id"] = fact_id
    if "confidence" in given and not _is_conforming_confidence(given["confidence"]):
        given["confidence"] = coerce_confidence(given["confidence"])
    category = given.get("category")
    source = given.get("source")
    source_error = given.get("sourceError")
    visibility, grants = fact_access(given)
    values = FactValues(
        fact_id=storable(fact_id),
        content=storable(given["content"]),
        category=storable(category)
        if isinstance(category, str) and len(category) <= MAX_CATEGORY
        else DEFAULT_CATEGORY,
        confidence=float(coerce_confidence(given.get("confidence"))),
        created_at=parse_timestamp(given.get("createdAt")),
        source=storable(source) if isinstance(source, str) and len(source) <= MAX_SOURCE else None,
        source_error=storable(source_error) if isinstance(source_error, str) else None,
        extra={},
        visibility=visibility,
        grants=grants,
    )
    record = encode_record(given, values.category)
    if record is not None:
        values = replace(values, record=record)
        # Tags and relations are sets: a valid list is stored and read back sorted, not verbatim.
        given.update(
            {key: value for key, value in record.document_keys(values.category).items() if key in _SETS}
        )
    # ``extra`` depends on what the columns reproduce, so it is filled in once they are known.
    values.extra.update(_with_overrides(_fact_base(values), given, FACT_FIELDS))
    canonical_json(values.extra)  # refuse what the database could not store (NaN, objects)
    return values


def decode_fact(values: FactValues) -> dict[str, Any]:
    return _apply_overrides(_fact_base(values), values.extra)


def _section_base(values: SectionValues) -> dict[str, Any]:
    updated = format_timestamp(values.updated_at) if values.updated_at is not None else ""
    return {"summary": values.summary, "updatedAt": updated}


def encode_section(raw: Mapping[str, Any]) -> SectionValues:
    summary = raw.get("summary")
    base = SectionValues(
        summary=storable(summary) if isinstance(summary, str) else "",
        updated_at=parse_timestamp(raw.get("updatedAt")),
        extra={},
    )
    base.extra.update(_with_overrides(_section_base(base), raw, SECTION_FIELDS))
    canonical_json(base.extra)
    return base


def decode_section(values: SectionValues) -> dict[str, Any]:
    return _apply_overrides(_section_base(values), values.extra)


def parse_document(
    memory: object,
    known_facts: Mapping[str, KnownFact] | None = None,
    known_sections: Mapping[str, KnownSection] | None = None,
    known_text: bytes | None = None,
    known_order: Sequence[IncomingFact] = (),
) -> IncomingDocument:
    """Validate and encode a document for saving; raises MalformedDocumentError rather than guess.

    Missing ``facts``/``user``/``history`` keys (or section names) mean "leave as stored", never
    "delete". Top-level keys other than revision/incarnation/version/user/history/facts, and
    section names outside the six known ones, are not stored.

    A fact or section exactly equal (``same_json``) to its ``known_*`` entry takes that entry's
    values without being encoded again: most of a loaded document comes back unchanged, and encoding
    every fact was most of the cost of a save. ``known_text`` is the known facts' exact JSON (see
    ``_unchanged_prefix``), given only when it holds no ``null``; ``known_order`` their ``fact``s in order.
    """
    if not isinstance(memory, dict):
        raise MalformedDocumentError(f"a memory document must be a dict, got {type(memory).__name__}")
    revision = memory.get("revision")
    if revision is not None and (not isinstance(revision, int) or isinstance(revision, bool) or revision < 0):
        raise MalformedDocumentError(f"'revision' must be a non-negative integer, got {revision!r}")
    incarnation = memory.get(INCARNATION_KEY) if revision is not None else None
    if incarnation is not None and not isinstance(incarnation, str):
        raise MalformedDocumentError(f"'{INCARNATION_KEY}' must be a string, got {incarnation!r}")
    version = memory.get("version")
    sections: dict[str, SectionValues] = {}
    for group, names in SECTION_GROUPS.items():
        if group not in memory:
            continue
        group_value = memory[group]
        if not isinstance(group_value, dict):
            raise MalformedDocumentError(f"'{group}' must be an object, got {type(group_value).__name__}")
        for name in names:
            if name not in group_value:
                continue
            section = group_value[name]
            if not isinstance(section, dict):
                raise MalformedDocumentError(f"section {group}.{name} must be an object")
            known = known_sections.get(name) if known_sections else None
            if known is not None and same_json(section, known.raw):
                sections[name] = known.values
            else:
                sections[name] = encode_section(section)
    facts, kept = None, 0
    if "facts" in memory:
        facts, kept = _parse_facts(memory["facts"], known_facts or {}, known_text, known_order)
    return IncomingDocument(
        revision=revision,
        incarnation=incarnation,
        version=version if isinstance(version, str) and len(version) <= MAX_VERSION else None,
        facts=facts,
        sections=sections,
        kept=kept,
    )


def _unchanged_prefix(
    raw_facts: list[Any], known: Mapping[str, KnownFact], text: bytes | None, order: Sequence[IncomingFact]
) -> list[IncomingFact]:
    """The stored facts, when the document starts with all of them unchanged and in stored order.

    The usual save (a loaded document plus appended facts) is decided at C speed: by the JSON of
    the document's first facts against the known facts' (``text``: equal text is equal values,
    types and key order included; orjson writes NaN as ``null``, which that text holds none of), else
    by one list ``==``, blind to ``1`` against ``1.0`` and ``True``, then each lax key's type. Anything
    else (an edit, a removal, a new order) is parsed fact by fact. ``order``: their ``fact``s, in order.
    """
    if len(raw_facts) < (size := len(known)):
        return []
    if text is None or exact_text(raw_facts[:size]) != text:
        if raw_facts[:size] != [entry.raw for entry in known.values()]:
            return []
        for entry, raw in zip(known.values(), raw_facts, strict=False):
            stored = entry.raw
            for key in entry.lax_keys:
                value, stored_value = raw[key], stored[key]
                if value is not stored_value and not same_types(value, stored_value):  # a loaded copy: `is`
                    return []
    return list(order) if len(order) == size else list(map(_FACT_OF, known.values()))


def _parse_facts(
    raw_facts: object, known: Mapping[str, KnownFact], text: bytes | None, order: Sequence[IncomingFact]
) -> tuple[list[IncomingFact], int]:
    """The facts, and how many lead them unchanged (``_unchanged_prefix``)."""
    if not isinstance(raw_facts, list):
        raise MalformedDocumentError(f"'facts' must be a list, got {type(raw_facts).__name__}")
    facts = _unchanged_prefix(raw_facts, known, text, order)
    kept = len(facts)
    seen_ids: set[str] = set()
    prior: Collection[str] = known.keys() if kept else ()  # the kept ids (all known, or none)
    for index, raw in enumerate(raw_facts[kept:], kept):
        if not isinstance(raw, dict):
            raise MalformedDocumentError(f"facts[{index}] must be an object, got {type(raw).__name__}")
        raw_id = raw.get("id")
        # A missing, odd or repeated id gets a fresh one rather than overwriting another fact.
        valid = isinstance(raw_id, str) and 0 < len(raw_id) <= MAX_FACT_ID
        given_id: str | None = raw_id if valid and raw_id not in seen_ids and raw_id not in prior else None
        if given_id is not None and (entry := known.get(given_id)) is not None and entry.matches(raw):
            seen_ids.add(given_id)
            facts.append(entry.fact)
            continue
        content = raw.get("content")
        if not isinstance(content, str) or not content.strip():
            raise MalformedDocumentError(f"facts[{index}] has no content (a non-blank string is required)")
        if given_id is None and prior:  # a made-up id must avoid every taken id: merged once
            seen_ids, prior = seen_ids | set(prior), ()
        fact_id = str(given_id) if given_id is not None else new_fact_id(seen_ids)
        seen_ids.add(fact_id)
        facts.append(IncomingFact(encode_fact(raw, fact_id), given_id is None))
    return facts, kept
