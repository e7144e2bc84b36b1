"""The cached snapshot of a scope and the save fast path that plans against it.

A ``Snapshot`` is a scope's live rows at one revision, as this process last read or wrote them.
When the caller loaded the revision the store is still at (the usual save: no concurrent
writer), ``plan_from_snapshot`` produces exactly ``merge.plan_merge``'s plan without reading the
rows, at a cost that follows the size of the change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, count, islice, repeat
from operator import attrgetter, is_not, lt, ne
from typing import cast

from memstore.retention import NO_SIGNALS, FactSignals
from memstore.storage.sql.documents.codec import (
    FactValues,
    IncomingDocument,
    IncomingFact,
    KnownFact,
    KnownSection,
    SectionValues,
    decode_section,
)
from memstore.storage.sql.documents.merge import (
    Cap,
    MergePlan,
    StoredSection,
    assign_positions,
    claim_content_keys,
    merge_sections,
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A scope's live rows at one revision, as this process last read or wrote them.

    Successive snapshots share their entries: nothing in a snapshot may be mutated.
    """

    facts: dict[str, KnownFact]  # by fact id, in document order
    values: tuple[FactValues, ...]  # each fact's ``KnownFact.fact.values``, in document order
    incoming: tuple[IncomingFact, ...]  # each fact's ``KnownFact.fact``, in document order
    positions: dict[str, int]
    owners: dict[str, str]  # content key -> id of the live fact that has it
    sections: dict[str, KnownSection]  # the stored section rows
    text: bytes | None = None
    """The facts as one JSON array of their ``KnownFact.text``; None when one has none."""
    comparable: bool = False
    """``text`` holds no ``null``: a caller's facts whose JSON is ``text`` are these (``orjson``
    writes NaN as ``null``, so only then does equal text mean equal values: ``codec.parse_document``)."""
    ordered: bool = False
    """The positions rise strictly in document order: new facts go after the last."""


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
    incoming = list(map(_FACT, entries.values()))
    changed = list(compress(count(), map(is_not, map(_VALUES, incoming), facts)))
    fresh = [facts[index] for index in changed]
    for index, values in zip(changed, fresh, strict=True):
        entries[values.fact_id] = entry = KnownFact.of(values)
        incoming[index] = entry.fact
    if previous is None:
        owners = {values.content_key: values.fact_id for values in facts}
    else:
        owners = previous.owners.copy()
        for fact_id in known.keys() - entries.keys() | {values.fact_id for values in fresh}:
            old = known.get(fact_id)
            if old is not None and owners.get(old.fact.values.content_key) == fact_id:
                del owners[old.fact.values.content_key]
        owners.update((values.content_key, values.fact_id) for values in fresh)
    texts = list(map(_TEXT, entries.values()))
    text = None if None in texts else b"".join((b"[", b",".join(cast(list[bytes], texts)), b"]"))
    comparable = text is not None and b"null" not in text
    by_id = dict(zip(entries, positions, strict=True))
    ordered = all(map(lt, positions, islice(positions, 1, None)))
    sections_known = _sections(sections, previous)
    # ``entries`` holds ``facts`` (ids are unique: the zip above is strict), so their values are these.
    return Snapshot(
        entries, tuple(facts), tuple(incoming), by_id, owners, sections_known, text, comparable, ordered
    )


def snapshot_appended(previous: Snapshot, plan: MergePlan) -> Snapshot:
    """``snapshot_of`` the plan of an appending save (``MergePlan.appended``): ``previous`` plus its
    inserts, at a cost that follows the facts added, not the scope's size. The copies are
    ``dict.copy``'s, which clone the table in one go even when a removal left holes in it (a
    ``dict(...)`` then re-inserts every key), and the text is spliced, not joined again."""
    entries, positions, owners = previous.facts.copy(), previous.positions.copy(), previous.owners.copy()
    added = [KnownFact.of(values) for values, _ in plan.inserts]
    for known, (values, position) in zip(added, plan.inserts, strict=True):
        entries[values.fact_id] = known
        positions[values.fact_id] = position
        owners[values.content_key] = values.fact_id
    texts = list(map(_TEXT, added))
    text, comparable = previous.text, previous.comparable
    if text is not None and added:
        if None in texts:
            text, comparable = None, False
        else:
            tail = b",".join(cast(list[bytes], texts))
            text = b"".join((memoryview(text)[:-1], b"," if previous.facts else b"", tail, b"]"))
            comparable = comparable and b"null" not in tail
    sections = _sections(plan.sections, previous)
    in_order = previous.values + tuple(inserted for inserted, _ in plan.inserts)
    incoming = previous.incoming + tuple(map(_FACT, added))
    return Snapshot(
        entries, in_order, incoming, positions, owners, sections, text, comparable, previous.ordered
    )


def _sections(sections: dict[str, SectionValues], previous: Snapshot | None) -> dict[str, KnownSection]:
    old_sections = previous.sections if previous is not None else {}
    known_sections: dict[str, KnownSection] = {}
    for name, section in sections.items():
        old_section = old_sections.get(name)
        if old_section is None or old_section.values is not section:
            old_section = KnownSection(decode_section(section), section)
        known_sections[name] = old_section
    return known_sections


def plan_from_snapshot(
    incoming: IncomingDocument,
    snapshot: Snapshot,
    *,
    current: int,
    stored_version: str,
    cap: Cap,
    read_signals: Callable[[], Mapping[str, FactSignals]],
) -> MergePlan | None:
    """``plan_merge``'s plan for a document loaded at ``current`` while the store still holds ``snapshot``.

    Unchanged facts cost a lookup each; only changed ones are compared, deduplicated and written.
    None when the document has made-up ids: one could collide with a tombstone the snapshot omits.
    Retention signals are no content (an access changes no revision), so the snapshot holds none:
    a save over the cap reads the live ones (``read_signals``, one small query) to rank as the
    full merge does.
    """
    plan = MergePlan(revision=current + 1)
    if incoming.facts is None:
        plan.facts = list(snapshot.values)
        plan.positions = list(snapshot.positions.values())
    elif incoming.kept == len(snapshot.facts) and _appended(incoming.facts, snapshot, cap, plan):
        pass
    elif not _facts_from_snapshot(incoming.facts, snapshot, cap, read_signals, plan):
        return None
    stored = {name: StoredSection(known.values, current) for name, known in snapshot.sections.items()}
    merge_sections(incoming, stored, current, plan)
    if incoming.version is not None and incoming.version != stored_version:
        plan.version = incoming.version
    return plan


def _appended(facts: list[IncomingFact], snapshot: Snapshot, cap: Cap, plan: MergePlan) -> bool:
    """``_facts_from_snapshot`` for the usual save, every stored fact kept in place and new ones
    after them, in the cost of the new ones; False (nothing planned) for any other."""
    tail = facts[len(snapshot.facts) :]
    if not snapshot.ordered or any(map(_GENERATED, tail)):
        return False
    # The tail's ids are none of the snapshot's (``codec`` renames a repeated id, and marks it made up).
    _, wins = claim_content_keys((), [fact.values.content_key for fact in tail], snapshot.owners.__contains__)
    added = list(compress(map(_VALUES, tail), wins))
    if added and len(snapshot.facts) + len(added) > cap.max_facts:
        return False
    last = next(reversed(snapshot.positions.values()), -1)
    new_positions = range(last + 1, last + 1 + len(added))
    plan.facts = [*snapshot.values, *added]
    plan.positions = [*snapshot.positions.values(), *new_positions]
    plan.inserts = list(zip(added, new_positions, strict=True))
    plan.appended = True
    return True


def _facts_from_snapshot(
    facts: list[IncomingFact],
    snapshot: Snapshot,
    cap: Cap,
    read_signals: Callable[[], Mapping[str, FactSignals]],
    plan: MergePlan,
) -> bool:
    """The fact writes of ``plan_merge`` with ``base == current``, computed from the diff.

    It applies merge's rule functions (``claim_content_keys``, ``Cap``) to the changed
    facts only: passes over every fact are C-level (map, compress), and Python code runs only for
    facts the caller changed.
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
                plan.tombstone(fact_id, entry.raw)
    # merge's dedup rule: unchanged facts claim their content keys first, then edits, then adds.
    gone.update(facts[index].values.fact_id for index in edited)

    def held_by_unchanged(key: str) -> bool:
        owner = snapshot.owners.get(key)
        return owner is not None and owner not in gone

    edit_wins, add_wins = claim_content_keys(
        [(facts[index].values.content_key, stored[index].fact.values.content_key) for index in edited],
        [facts[index].values.content_key for index in added],
        held_by_unchanged,
    )
    chosen = {index for index, wins in zip(edited, edit_wins, strict=True) if wins}
    chosen.update(index for index, wins in zip(added, add_wins, strict=True) if wins)
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
    chosen_at_cap = None
    adding = any(index not in dropped for index in added)  # the cost of the change, not of the scope
    if len(final) > cap.max_facts and adding:
        # A new fact has no signals yet, even where its id is a tombstone's (a revival).
        live = read_signals() if cap.policy.policy != "confidence" else {}
        signals = [
            live.get(values.fact_id, NO_SIGNALS)
            if stored[index] is not _ABSENT
            else cap.inherited.get(values.fact_id, NO_SIGNALS)
            for index, values in zip(order, final, strict=True)
        ]
        chosen_at_cap = cap.choose(final, signals, adding=adding)
    if chosen_at_cap is not None:
        keep, evicted = chosen_at_cap
        for rank, index in enumerate(order):
            if rank not in keep and stored[index] is not _ABSENT:
                plan.tombstone(final[rank].fact_id, stored[index].raw, cap.detail(evicted[rank]))
        order = [index for rank, index in enumerate(order) if rank in keep]
        final = [values for rank, values in enumerate(final) if rank in keep]
    current = list(map(snapshot.positions.get, map(_ID, final)))
    plan.facts, plan.positions = final, assign_positions(current)
    updates = [index for index in edited if index in chosen]
    if updates and not isinstance(order, range):
        rank_of = {index: rank for rank, index in enumerate(order)}
        updates = [rank_of[index] for index in updates if index in rank_of]
    for rank in sorted({*compress(count(), map(ne, plan.positions, current)), *updates}):
        values, position, old = final[rank], plan.positions[rank], current[rank]
        if old is None:
            plan.inserts.append((values, position))
        elif order[rank] in chosen:
            plan.update(values, position, stored[order[rank]].raw)
        else:
            plan.moves.append((values.fact_id, position))
    return True


_TEXT = attrgetter("text")
_GENERATED = attrgetter("generated_id")
_FACT_ID = attrgetter("values.fact_id")
_FACT = attrgetter("fact")
_VALUES = attrgetter("values")
_ID = attrgetter("fact_id")
# Stands in for "not in the snapshot", so C-level passes need no None checks.
_ABSENT = KnownFact(
    {}, IncomingFact(FactValues("", "", "", 0.0, None, None, None, {}), generated_id=False), (), None, True
)
