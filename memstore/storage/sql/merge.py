"""Pure merge planning: what one save writes, given the stored rows and the caller's document.

``base`` is the revision the caller loaded (the document's ``revision``), ``current`` the scope's
revision under the write lock. Rows carry the revision that added, last updated and deleted
them, which is what separates "the caller changed this" from "someone else did, after the caller
loaded". With ``base == current`` (nothing happened in between, or a document without a revision,
which is authoritative) the document simply replaces the scope.

Rules, per fact id:
- live in the store: take the caller's values only if the row was not updated after ``base``
  (first committer wins per fact);
- tombstoned: deleted after ``base`` means deleted concurrently, so it stays deleted; deleted at
  or before ``base`` means the caller re-added it on purpose (an import), so it is revived;
- unknown: inserted, unless a live fact already has its content key (dedup);
- live in the store but absent from the document: added after ``base`` means added concurrently
  and kept; otherwise the caller deleted it and it is tombstoned.
Sections take the caller's value only when it differs and the row is not newer than ``base``.
Order: the document's order when ``base == current``, else the stored order with new facts
appended. Finally ``max_facts`` tombstones the lowest-confidence facts (ties keep earlier ones).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from memstore.storage.sql.codec import (
    EMPTY_SECTION,
    FactValues,
    IncomingDocument,
    IncomingFact,
    SectionValues,
    decode_fact,
    decode_section,
)


@dataclass(frozen=True, slots=True)
class StoredFact:
    row_id: int
    values: FactValues
    position: int
    added_revision: int
    updated_revision: int
    deleted_revision: int | None


@dataclass(frozen=True, slots=True)
class StoredSection:
    values: SectionValues
    revision: int


@dataclass(frozen=True, slots=True)
class Change:
    """One audit row: ``before``/``after`` are document-shaped dicts (None for insert/delete)."""

    entity: str
    entity_id: str
    action: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@dataclass(slots=True)
class MergePlan:
    revision: int
    inserts: list[tuple[FactValues, int]] = field(default_factory=list)
    updates: list[tuple[int, FactValues, int]] = field(default_factory=list)
    revives: list[tuple[int, FactValues, int]] = field(default_factory=list)
    moves: list[tuple[int, int]] = field(default_factory=list)
    tombstones: list[int] = field(default_factory=list)
    section_inserts: list[tuple[str, SectionValues]] = field(default_factory=list)
    section_updates: list[tuple[str, SectionValues]] = field(default_factory=list)
    version: str | None = None
    changes: list[Change] = field(default_factory=list)
    facts: list[FactValues] = field(default_factory=list)
    sections: dict[str, SectionValues] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(
            self.inserts
            or self.updates
            or self.revives
            or self.moves
            or self.tombstones
            or self.section_inserts
            or self.section_updates
            or self.version is not None
        )


class _Kind(Enum):
    KEEP = "keep"
    UPDATE = "update"
    REVIVE = "revive"
    INSERT = "insert"


@dataclass(slots=True)
class _Entry:
    kind: _Kind
    values: FactValues
    row: StoredFact | None


def plan_merge(
    incoming: IncomingDocument,
    *,
    stored_facts: list[StoredFact],
    stored_sections: dict[str, StoredSection],
    stored_version: str,
    current: int,
    max_facts: int,
    new_id: Callable[[], str],
) -> MergePlan:
    """The writes that merge ``incoming`` into the stored scope at revision ``current``.

    ``stored_facts`` must hold every live row plus the tombstones of ids the document mentions.
    """
    base = current if incoming.revision is None else min(incoming.revision, current)
    plan = MergePlan(revision=current + 1)
    live = sorted(
        (row for row in stored_facts if row.deleted_revision is None),
        key=lambda row: (row.position, row.row_id),
    )
    if incoming.facts is None:
        plan.facts = [row.values for row in live]
    else:
        entries = _fact_entries(incoming.facts, stored_facts, live, base, current, new_id, plan)
        _write_facts(_cap(_dedup(entries), max_facts, plan), plan)
    _merge_sections(incoming, stored_sections, base, plan)
    if incoming.version is not None and incoming.version != stored_version:
        plan.version = incoming.version
    return plan


def _fact_entries(
    facts: list[IncomingFact],
    stored_facts: list[StoredFact],
    live: list[StoredFact],
    base: int,
    current: int,
    new_id: Callable[[], str],
    plan: MergePlan,
) -> list[_Entry]:
    """Classify every document fact and live row, tombstoning what the caller deleted; final order."""
    by_id = {row.values.fact_id: row for row in stored_facts}
    taken_ids = set(by_id) | {fact.values.fact_id for fact in facts}
    mentioned: set[str] = set()
    from_document: list[_Entry] = []
    for fact in facts:
        values = fact.values
        if fact.generated_id and values.fact_id in by_id:
            values = _reroll_id(values, taken_ids, new_id)
        row = by_id.get(values.fact_id)
        mentioned.add(values.fact_id)
        if row is None:
            from_document.append(_Entry(_Kind.INSERT, values, None))
        elif row.deleted_revision is None:
            caller_wins = row.updated_revision <= base and not row.values.same_as(values)
            kind = _Kind.UPDATE if caller_wins else _Kind.KEEP
            from_document.append(_Entry(kind, values if caller_wins else row.values, row))
        elif row.deleted_revision <= base:
            from_document.append(_Entry(_Kind.REVIVE, values, row))
    concurrent: list[_Entry] = []
    for row in live:
        if row.values.fact_id in mentioned:
            continue
        if row.added_revision > base:
            concurrent.append(_Entry(_Kind.KEEP, row.values, row))
        else:
            _tombstone(row, plan)
    if base == current:
        return from_document + concurrent
    # Merge mode: the stored order first, then what the caller added, in the caller's order.
    order = {row.row_id: index for index, row in enumerate(live)}
    existing = [entry for entry in from_document + concurrent if entry.kind in (_Kind.KEEP, _Kind.UPDATE)]
    existing.sort(key=lambda entry: order[entry.row.row_id] if entry.row is not None else 0)
    added = [entry for entry in from_document if entry.kind in (_Kind.REVIVE, _Kind.INSERT)]
    return existing + added


def _reroll_id(values: FactValues, taken: set[str], new_id: Callable[[], str]) -> FactValues:
    """A made-up id that happens to exist in the store must not overwrite that stored fact."""
    fact_id = new_id()
    while fact_id in taken:
        fact_id = new_id()
    taken.add(fact_id)
    return replace(values, fact_id=fact_id)


def _dedup(entries: list[_Entry]) -> list[_Entry]:
    """Keep content keys unique among live facts: unchanged rows claim first, then edits, then adds.

    An edit that would collide is reverted to the stored value; an add that collides is dropped.
    """
    claimed = {entry.values.content_key for entry in entries if entry.kind is _Kind.KEEP}
    for entry in entries:
        if entry.kind is _Kind.UPDATE:
            if entry.values.content_key in claimed and entry.row is not None:
                entry.kind, entry.values = _Kind.KEEP, entry.row.values
            claimed.add(entry.values.content_key)
    kept: list[_Entry] = []
    for entry in entries:
        if entry.kind in (_Kind.REVIVE, _Kind.INSERT):
            if entry.values.content_key in claimed:
                continue
            claimed.add(entry.values.content_key)
        kept.append(entry)
    return kept


def _cap(entries: list[_Entry], max_facts: int, plan: MergePlan) -> list[_Entry]:
    """Drop the lowest-confidence facts beyond ``max_facts``; stable, so ties keep earlier facts."""
    if len(entries) <= max_facts:
        return entries
    ranked = sorted(range(len(entries)), key=lambda index: -entries[index].values.confidence)
    keep = set(ranked[:max_facts])
    for index, entry in enumerate(entries):
        if index not in keep and entry.row is not None and entry.kind is not _Kind.REVIVE:
            _tombstone(entry.row, plan)
    return [entry for index, entry in enumerate(entries) if index in keep]


def _tombstone(row: StoredFact, plan: MergePlan) -> None:
    plan.tombstones.append(row.row_id)
    plan.changes.append(Change("fact", row.values.fact_id, "delete", decode_fact(row.values), None))


def _write_facts(entries: list[_Entry], plan: MergePlan) -> None:
    current = [
        entry.row.position if entry.kind in (_Kind.KEEP, _Kind.UPDATE) and entry.row else None
        for entry in entries
    ]
    for entry, position in zip(entries, _assign_positions(current), strict=True):
        values, row = entry.values, entry.row
        if entry.kind is _Kind.INSERT:
            plan.inserts.append((values, position))
            plan.changes.append(Change("fact", values.fact_id, "insert", None, decode_fact(values)))
        elif entry.kind is _Kind.REVIVE and row is not None:
            plan.revives.append((row.row_id, values, position))
            plan.changes.append(Change("fact", values.fact_id, "insert", None, decode_fact(values)))
        elif entry.kind is _Kind.UPDATE and row is not None:
            plan.updates.append((row.row_id, values, position))
            plan.changes.append(
                Change("fact", values.fact_id, "update", decode_fact(row.values), decode_fact(values))
            )
        elif row is not None and position != row.position:
            plan.moves.append((row.row_id, position))
        plan.facts.append(values)


def _assign_positions(current: list[int | None]) -> list[int]:
    """Strictly increasing positions that keep every stored position that is already in order.

    Positions only need to sort, not to be dense, so deleting or appending rewrites no other row.
    """
    first = next((index for index, position in enumerate(current) if position is not None), None)
    start = 0 if first is None else (current[first] or 0) - first
    positions: list[int] = []
    last = start - 1
    for position in current:
        last = position if position is not None and position > last else last + 1
        positions.append(last)
    return positions


def _merge_sections(
    incoming: IncomingDocument, stored: dict[str, StoredSection], base: int, plan: MergePlan
) -> None:
    plan.sections = {name: section.values for name, section in stored.items()}
    for name, values in incoming.sections.items():
        row = stored.get(name)
        before = row.values if row is not None else EMPTY_SECTION
        if values.same_as(before) or (row is not None and row.revision > base):
            continue
        if row is None:
            plan.section_inserts.append((name, values))
        else:
            plan.section_updates.append((name, values))
        plan.sections[name] = values
        plan.changes.append(
            Change(
                "section",
                name,
                "insert" if row is None else "update",
                decode_section(row.values) if row is not None else None,
                decode_section(values),
            )
        )
