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
- unknown: inserted, unless a live fact already has its content key (dedup, ``claim_content_keys``);
- live in the store but absent from the document: added after ``base`` means added concurrently
  and kept; otherwise the caller deleted it and it is tombstoned.
Sections take the caller's value only when it differs and the row is not newer than ``base``.
Order: the document's order when ``base == current``, else the stored order with new facts
appended. Finally, when the save adds facts, the cap (``Cap``) tombstones the facts
``memstore.retention`` ranks lowest, recording each one's score in the audit ``detail``.

Rows are addressed by fact id (unique per scope), and a revived fact is written like a new one
(an upsert), so a plan needs no row ids. ``snapshot.plan_from_snapshot`` plans the common save
from a cached snapshot with the same two rule functions. The audit rows a plan implies are
derived from it by ``history.changes_of``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from itertools import islice
from operator import lt
from typing import Any, cast

from memstore.retention import NO_SIGNALS, Candidate, FactSignals, RetentionPolicy, Score
from memstore.storage.sql.documents.codec import (
    EMPTY_SECTION,
    FactValues,
    IncomingDocument,
    IncomingFact,
    SectionValues,
    decode_fact,
)
from memstore.storage.sql.documents.history import Change, changes_of


@dataclass(frozen=True, slots=True)
class StoredFact:
    row_id: int
    values: FactValues
    position: int
    added_revision: int
    updated_revision: int
    deleted_revision: int | None
    signals: FactSignals = NO_SIGNALS


@dataclass(frozen=True, slots=True)
class StoredSection:
    values: SectionValues
    revision: int


@dataclass(slots=True)
class MergePlan:
    """The writes of one save (facts by id; ``inserts`` also revive tombstoned ids) and the result.

    ``fact_before`` and ``section_before`` hold the stored values of every updated or tombstoned
    fact and every updated section, which is all the audit trail needs besides the writes.
    ``removal_detail`` says why a tombstoned fact went, where the save knows more than "the
    caller deleted it" (an eviction's score, or what the caller reported).
    """

    revision: int
    inserts: list[tuple[FactValues, int]] = field(default_factory=list)
    updates: list[tuple[FactValues, int]] = field(default_factory=list)
    moves: list[tuple[str, int]] = field(default_factory=list)
    tombstones: list[str] = field(default_factory=list)
    section_inserts: list[tuple[str, SectionValues]] = field(default_factory=list)
    section_updates: list[tuple[str, SectionValues]] = field(default_factory=list)
    version: str | None = None
    fact_before: dict[str, dict[str, Any]] = field(default_factory=dict)
    section_before: dict[str, SectionValues] = field(default_factory=dict)
    facts: list[FactValues] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    sections: dict[str, SectionValues] = field(default_factory=dict)
    removal_detail: dict[str, dict[str, Any]] = field(default_factory=dict)
    appended: bool = False
    """The facts are the planned-against snapshot's, in place, then ``inserts`` (``snapshot.py``)."""

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

    @property
    def changes(self) -> list[Change]:
        """The audit rows this plan implies (see ``history.py``)."""
        return changes_of(self)

    def tombstone(self, fact_id: str, before: dict[str, Any], detail: dict[str, Any] | None = None) -> None:
        self.tombstones.append(fact_id)
        self.fact_before[fact_id] = before
        if detail is not None:
            self.removal_detail[fact_id] = detail

    @property
    def evictions(self) -> int:
        """Facts this plan removes at the cap (``Cap.detail``), not at the caller's request."""
        return sum(1 for detail in self.removal_detail.values() if detail.get("reason") == "evicted")

    def update(self, values: FactValues, position: int, before: dict[str, Any]) -> None:
        self.updates.append((values, position))
        self.fact_before[values.fact_id] = before


def claim_content_keys(
    edits: Sequence[tuple[str, str]], adds: Sequence[str], is_taken: Callable[[str], bool]
) -> tuple[list[bool], list[bool]]:
    """The dedup rule, for both planners: which edits and adds may keep their content key.

    ``is_taken`` says whether a fact the save leaves unchanged holds a key: those claim first.
    Then edits claim in order (``(new key, stored key)``; an edit that collides is undone and
    keeps its stored key), then adds in order (one that collides is dropped).
    """
    claimed: set[str] = set()

    def taken(key: str) -> bool:
        return key in claimed or is_taken(key)

    edit_wins: list[bool] = []
    for new_key, stored_key in edits:
        wins = not taken(new_key)
        claimed.add(new_key if wins else stored_key)
        edit_wins.append(wins)
    add_wins: list[bool] = []
    for key in adds:
        wins = not taken(key)
        if wins:
            claimed.add(key)
        add_wins.append(wins)
    return edit_wins, add_wins


@dataclass(frozen=True, slots=True)
class Cap:
    """The cap rule, for both planners: at most ``max_facts`` live facts, ranked by ``policy``."""

    max_facts: int
    policy: RetentionPolicy
    now: datetime
    inherited: Mapping[str, FactSignals] = field(default_factory=dict)
    """Signals of facts the save inserts that take over others' (a merge and its sources)."""

    def choose(
        self, facts: Sequence[FactValues], signals: Sequence[FactSignals], *, adding: bool
    ) -> tuple[set[int], dict[int, Score]] | None:
        """Indexes kept and the evicted ones' scores; ``None`` when nothing is to go.

        Only a save that adds (or revives) facts evicts: one that edits or removes never costs
        another fact, even in a scope already over the cap (a host's larger cap, a cap lowered).
        """
        if len(facts) <= self.max_facts or not adding:
            return None
        candidates = [
            Candidate(values.fact_id, values.category, values.confidence, values.created_at, signal)
            for values, signal in zip(facts, signals, strict=True)
        ]
        kept, evicted = self.policy.select(candidates, self.max_facts, self.now)
        return set(kept), evicted

    def detail(self, score: Score) -> dict[str, Any]:
        """The audit ``detail`` of an eviction."""
        return score.detail("evicted", policy=self.policy.policy, max_facts=self.max_facts)


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
    cap: Cap,
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
        _write_facts(_cap(_dedup(entries), cap, plan), plan)
    merge_sections(incoming, stored_sections, base, plan)
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
            plan.tombstone(row.values.fact_id, decode_fact(row.values))
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
    """Apply ``claim_content_keys``: a colliding edit reverts to the stored value, a colliding add goes."""
    kept_keys = {entry.values.content_key for entry in entries if entry.kind is _Kind.KEEP}
    edits = [entry for entry in entries if entry.kind is _Kind.UPDATE and entry.row is not None]
    adds = [entry for entry in entries if entry.kind in (_Kind.REVIVE, _Kind.INSERT)]
    edit_wins, add_wins = claim_content_keys(
        [(entry.values.content_key, entry.row.values.content_key) for entry in edits if entry.row],
        [entry.values.content_key for entry in adds],
        kept_keys.__contains__,
    )
    for entry, wins in zip(edits, edit_wins, strict=True):
        if not wins and entry.row is not None:
            entry.kind, entry.values = _Kind.KEEP, entry.row.values
    dropped = {id(entry) for entry, wins in zip(adds, add_wins, strict=True) if not wins}
    return [entry for entry in entries if id(entry) not in dropped]


def _cap(entries: list[_Entry], cap: Cap, plan: MergePlan) -> list[_Entry]:
    """Apply ``cap``: stored facts it evicts are tombstoned with their score."""
    chosen = cap.choose(
        [entry.values for entry in entries],
        # A revived fact starts afresh (its row's signals are reset when it is written back).
        [
            entry.row.signals if entry.row and entry.kind is not _Kind.REVIVE else NO_SIGNALS
            for entry in entries
        ],
        adding=any(entry.kind in (_Kind.INSERT, _Kind.REVIVE) for entry in entries),
    )
    if chosen is None:
        return entries
    keep, evicted = chosen
    for index, score in evicted.items():
        entry = entries[index]
        if entry.row is not None and entry.kind is not _Kind.REVIVE:
            plan.tombstone(entry.row.values.fact_id, decode_fact(entry.row.values), cap.detail(score))
    return [entry for index, entry in enumerate(entries) if index in keep]


def _write_facts(entries: list[_Entry], plan: MergePlan) -> None:
    current = [
        entry.row.position if entry.kind in (_Kind.KEEP, _Kind.UPDATE) and entry.row else None
        for entry in entries
    ]
    plan.positions = assign_positions(current)
    for entry, position in zip(entries, plan.positions, strict=True):
        values, row = entry.values, entry.row
        if entry.kind in (_Kind.INSERT, _Kind.REVIVE):
            plan.inserts.append((values, position))
        elif entry.kind is _Kind.UPDATE and row is not None:
            plan.update(values, position, decode_fact(row.values))
        elif row is not None and position != row.position:
            plan.moves.append((values.fact_id, position))
        plan.facts.append(values)


def assign_positions(current: list[int | None]) -> list[int]:
    """Strictly increasing positions that keep every stored position that is already in order.

    Positions only need to sort, not to be dense, so deleting or appending rewrites no other row.
    """
    stored = len(current)
    while stored and current[stored - 1] is None:
        stored -= 1
    kept = cast(list[int], current[:stored])
    if None not in kept and all(map(lt, kept, islice(kept, 1, None))):
        # The usual save (stored facts in order, new ones appended) decided at C speed.
        last = kept[-1] if kept else -1
        return kept + list(range(last + 1, last + 1 + len(current) - stored))
    first = next((index for index, position in enumerate(current) if position is not None), None)
    start = 0 if first is None else (current[first] or 0) - first
    positions: list[int] = []
    last = start - 1
    for position in current:
        last = position if position is not None and position > last else last + 1
        positions.append(last)
    return positions


def merge_sections(
    incoming: IncomingDocument, stored: dict[str, StoredSection], base: int, plan: MergePlan
) -> None:
    """Sections: the caller's value wins when it differs and the row is not newer than ``base``."""
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
            plan.section_before[name] = row.values
        plan.sections[name] = values
