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

Rows are addressed by fact id (unique per scope), and a revived fact is written like a new one
(an upsert), so a plan needs no row ids: ``plan_from_snapshot`` can then plan the common save --
the caller loaded the revision the store is still at -- from this process's cached ``Snapshot``,
without reading the rows, at a cost that follows the size of the change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from itertools import compress, count, repeat
from operator import attrgetter, is_not, ne
from typing import Any

from memstore.storage.sql.codec import (
    EMPTY_SECTION,
    FactValues,
    IncomingDocument,
    IncomingFact,
    KnownFact,
    KnownSection,
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
    """The writes of one save (facts by id; ``inserts`` also revive tombstoned ids) and the result."""

    revision: int
    inserts: list[tuple[FactValues, int]] = field(default_factory=list)
    updates: list[tuple[FactValues, int]] = field(default_factory=list)
    moves: list[tuple[str, int]] = field(default_factory=list)
    tombstones: list[str] = field(default_factory=list)
    section_inserts: list[tuple[str, SectionValues]] = field(default_factory=list)
    section_updates: list[tuple[str, SectionValues]] = field(default_factory=list)
    version: str | None = None
    changes: list[Change] = field(default_factory=list)
    facts: list[FactValues] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    sections: dict[str, SectionValues] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(
            self.inserts
            or self.updates
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
        plan.positions = [row.position for row in live]
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
            _tombstone(row.values.fact_id, decode_fact(row.values), plan)
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
    keep = _most_confident([entry.values for entry in entries], max_facts)
    for index, entry in enumerate(entries):
        if index not in keep and entry.row is not None and entry.kind is not _Kind.REVIVE:
            _tombstone(entry.row.values.fact_id, decode_fact(entry.row.values), plan)
    return [entry for index, entry in enumerate(entries) if index in keep]


def _most_confident(facts: list[FactValues], max_facts: int) -> set[int]:
    ranked = sorted(range(len(facts)), key=lambda index: -facts[index].confidence)
    return set(ranked[:max_facts])


def _tombstone(fact_id: str, before: dict[str, Any], plan: MergePlan) -> None:
    plan.tombstones.append(fact_id)
    plan.changes.append(Change("fact", fact_id, "delete", before, None))


def _write_facts(entries: list[_Entry], plan: MergePlan) -> None:
    current = [
        entry.row.position if entry.kind in (_Kind.KEEP, _Kind.UPDATE) and entry.row else None
        for entry in entries
    ]
    plan.positions = _assign_positions(current)
    for entry, position in zip(entries, plan.positions, strict=True):
        values, row = entry.values, entry.row
        if entry.kind in (_Kind.INSERT, _Kind.REVIVE):
            _insert(values, position, plan)
        elif entry.kind is _Kind.UPDATE and row is not None:
            _update(values, position, decode_fact(row.values), plan)
        elif row is not None and position != row.position:
            plan.moves.append((values.fact_id, position))
        plan.facts.append(values)


def _insert(values: FactValues, position: int, plan: MergePlan) -> None:
    plan.inserts.append((values, position))
    plan.changes.append(Change("fact", values.fact_id, "insert", None, decode_fact(values)))


def _update(values: FactValues, position: int, before: dict[str, Any], plan: MergePlan) -> None:
    plan.updates.append((values, position))
    plan.changes.append(Change("fact", values.fact_id, "update", before, decode_fact(values)))


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


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A scope's live rows at one revision, as this process last read or wrote them.

    Successive snapshots share their entries: nothing in a snapshot may be mutated.
    """

    facts: dict[str, KnownFact]  # by fact id, in document order
    positions: dict[str, int]
    owners: dict[str, str]  # content key -> id of the live fact that has it
    sections: dict[str, KnownSection]  # the stored section rows


def snapshot_of(
    facts: list[FactValues],
    positions: list[int],
    sections: dict[str, SectionValues],
    previous: Snapshot | None = None,
) -> Snapshot:
    """The snapshot of these rows; entries whose values ``previous`` already holds are reused, not decoded."""
    known = previous.facts if previous is not None else {}
    ids = list(map(_ID, facts))
    entries = dict(zip(ids, map(known.get, ids, repeat(_ABSENT)), strict=True))
    fresh = list(compress(facts, map(is_not, map(_ENTRY_VALUES, entries.values()), facts)))
    for values in fresh:
        entries[values.fact_id] = KnownFact.of(values)
    if previous is None:
        owners = {values.content_key: values.fact_id for values in facts}
    else:
        owners = dict(previous.owners)
        for fact_id in known.keys() - entries.keys() | {values.fact_id for values in fresh}:
            old = known.get(fact_id)
            if old is not None and owners.get(old.fact.values.content_key) == fact_id:
                del owners[old.fact.values.content_key]
        owners.update((values.content_key, values.fact_id) for values in fresh)
    old_sections = previous.sections if previous is not None else {}
    known_sections: dict[str, KnownSection] = {}
    for name, section in sections.items():
        old_section = old_sections.get(name)
        if old_section is None or old_section.values is not section:
            old_section = KnownSection(decode_section(section), section)
        known_sections[name] = old_section
    return Snapshot(entries, dict(zip(entries, positions, strict=True)), owners, known_sections)


def plan_from_snapshot(
    incoming: IncomingDocument, snapshot: Snapshot, *, current: int, stored_version: str, max_facts: int
) -> MergePlan | None:
    """``plan_merge``'s plan for a document loaded at ``current`` while the store still holds ``snapshot``.

    Unchanged facts cost a lookup each; only changed ones are compared, deduplicated and written.
    None when the document has made-up ids: one could collide with a tombstone the snapshot omits.
    """
    plan = MergePlan(revision=current + 1)
    if incoming.facts is None:
        plan.facts = [entry.fact.values for entry in snapshot.facts.values()]
        plan.positions = list(snapshot.positions.values())
    elif not _facts_from_snapshot(incoming.facts, snapshot, max_facts, plan):
        return None
    stored = {name: StoredSection(known.values, current) for name, known in snapshot.sections.items()}
    _merge_sections(incoming, stored, current, plan)
    if incoming.version is not None and incoming.version != stored_version:
        plan.version = incoming.version
    return plan


def _facts_from_snapshot(
    facts: list[IncomingFact], snapshot: Snapshot, max_facts: int, plan: MergePlan
) -> bool:
    """The fact writes of ``plan_merge`` with ``base == current``: the same rules, applied to the diff.

    Passes over every fact are C-level (map, compress); Python code runs only for changed facts.
    """
    if any(map(_GENERATED, facts)):
        return False
    known = snapshot.facts
    stored = list(map(known.get, map(_FACT_ID, facts), repeat(_ABSENT)))
    changed = list(compress(count(), map(is_not, map(_FACT, stored), facts)))
    added = [index for index in changed if stored[index] is _ABSENT]
    edited = [
        index
        for index in changed
        if stored[index] is not _ABSENT and not stored[index].fact.values.same_as(facts[index].values)
    ]
    gone: set[str] = set()
    if len(facts) - len(added) < len(known):  # ids are unique, so some stored fact is missing
        mentioned = set(map(_FACT_ID, facts))
        for fact_id, entry in known.items():
            if fact_id not in mentioned:
                gone.add(fact_id)
                _tombstone(fact_id, entry.raw, plan)
    # As _dedup: unchanged facts claim their content keys first, then edits in order, then adds.
    gone.update(facts[index].values.fact_id for index in edited)
    claimed: set[str] = set()

    def taken(key: str) -> bool:
        owner = snapshot.owners.get(key)
        return key in claimed or (owner is not None and owner not in gone)

    chosen: set[int] = set()
    for index in edited:
        if taken(facts[index].values.content_key):
            claimed.add(stored[index].fact.values.content_key)
        else:
            claimed.add(facts[index].values.content_key)
            chosen.add(index)
    for index in added:
        if not taken(facts[index].values.content_key):
            claimed.add(facts[index].values.content_key)
            chosen.add(index)
    # Unchanged facts carry their stored values; an unchosen edit is undone, an unchosen add dropped.
    final = list(map(_VALUES, facts))
    for index in changed:
        if index not in chosen and stored[index] is not _ABSENT:
            final[index] = stored[index].fact.values
    order: Sequence[int] = range(len(facts))
    dropped = {index for index in added if index not in chosen}
    if dropped:
        order = [index for index in order if index not in dropped]
        final = [final[index] for index in order]
    if len(final) > max_facts:
        keep = _most_confident(final, max_facts)
        for rank, index in enumerate(order):
            if rank not in keep and stored[index] is not _ABSENT:
                _tombstone(final[rank].fact_id, stored[index].raw, plan)
        order = [index for rank, index in enumerate(order) if rank in keep]
        final = [values for rank, values in enumerate(final) if rank in keep]
    current = list(map(snapshot.positions.get, map(_ID, final)))
    plan.facts, plan.positions = final, _assign_positions(current)
    updates = [index for index in edited if index in chosen]
    if updates and not isinstance(order, range):
        rank_of = {index: rank for rank, index in enumerate(order)}
        updates = [rank_of[index] for index in updates if index in rank_of]
    for rank in sorted({*compress(count(), map(ne, plan.positions, current)), *updates}):
        values, position, old = final[rank], plan.positions[rank], current[rank]
        if old is None:
            _insert(values, position, plan)
        elif order[rank] in chosen:
            _update(values, position, stored[order[rank]].raw, plan)
        else:
            plan.moves.append((values.fact_id, position))
    return True


_GENERATED = attrgetter("generated_id")
_FACT_ID = attrgetter("values.fact_id")
_FACT = attrgetter("fact")
_VALUES = attrgetter("values")
_ID = attrgetter("fact_id")
_ENTRY_VALUES = attrgetter("fact.values")
# Stands in for "not in the snapshot", so C-level passes need no None checks.
_ABSENT = KnownFact(
    {}, IncomingFact(FactValues("", "", "", 0.0, None, None, None, {}), generated_id=False), ()
)
