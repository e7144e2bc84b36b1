"""The audit trail, derived from a merge plan: one ``memory_history`` row per changed fact or section.

Planning decides what to write; this module only describes it, the way SQLAlchemy's
``versioned_history`` example derives history rows from what a flush changes. Rows come in a
fixed order: deletions first, then fact writes by position, then sections in document order.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from memstore.document import HISTORY_SECTIONS, USER_SECTIONS
from memstore.storage.sql.documents.codec import decode_fact, decode_section

if TYPE_CHECKING:
    from memstore.storage.sql.documents.merge import MergePlan

_SECTION_ORDER = {name: index for index, name in enumerate(USER_SECTIONS + HISTORY_SECTIONS)}


@dataclass(frozen=True, slots=True)
class Change:
    """One audit row: ``before``/``after`` are document-shaped dicts (None for insert/delete)."""

    entity: str
    entity_id: str
    action: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    detail: dict[str, Any] | None = None


def changes_of(plan: MergePlan) -> list[Change]:
    """The audit rows for ``plan``: what each write replaced and what it stored."""
    before = plan.fact_before
    changes = [
        Change("fact", fact_id, "delete", before[fact_id], None, plan.removal_detail.get(fact_id))
        for fact_id in plan.tombstones
    ]
    writes = sorted(
        [(position, values, None) for values, position in plan.inserts]
        + [(position, values, before[values.fact_id]) for values, position in plan.updates],
        key=itemgetter(0),
    )
    for _, values, replaced in writes:
        action = "insert" if replaced is None else "update"
        changes.append(Change("fact", values.fact_id, action, replaced, decode_fact(values)))
    sections = sorted(plan.section_inserts + plan.section_updates, key=lambda item: _SECTION_ORDER[item[0]])
    for name, section in sections:
        stored = plan.section_before.get(name)
        action = "insert" if stored is None else "update"
        old = None if stored is None else decode_section(stored)
        changes.append(Change("section", name, action, old, decode_section(section)))
    return changes
