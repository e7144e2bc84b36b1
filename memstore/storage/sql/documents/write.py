"""The steps of one save transaction: the erasure fence, planning, and writing the plan.

``provider.SqlMemoryStorage._write`` runs them in order under the scope's write lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RootTransaction, insert

from memstore.document import as_utc, new_fact_id
from memstore.errors import AccessDeniedError, LeaseLostError
from memstore.retention import FactSignals
from memstore.scope import Scope
from memstore.storage.sql.documents.cache import AnyRow, CacheEntry, incarnation, stamp_of
from memstore.storage.sql.documents.codec import (
    FactValues,
    IncomingDocument,
    Relations,
    SectionValues,
)
from memstore.storage.sql.documents.grants import PRIVATE, SHARED, SHARING_ROLES, Grants, fact_access
from memstore.storage.sql.documents.json_values import json_object
from memstore.storage.sql.documents.links import (
    clear_tombstoned_links,
    record_of_row,
    stored_links,
    write_links,
)
from memstore.storage.sql.documents.merge import Cap, MergePlan, StoredFact, StoredSection, plan_merge
from memstore.storage.sql.documents.snapshot import plan_from_snapshot
from memstore.storage.sql.documents.statements import (
    ANNOTATE_DELETION,
    CONFIRM_FACTS,
    DELETE_GRANTS,
    FACTS_QUERY,
    GRANTS_QUERY,
    INSERT_GRANT,
    INSERT_HISTORY,
    MAX_BOUND_IDS,
    MOVE_FACT,
    RUN_INSERT_FACTS,
    RUN_INSERT_HISTORY,
    SECTIONS_QUERY,
    TOMBSTONE_FACTS,
    TOMBSTONES_QUERY,
    UPDATE_FACT,
    UPDATE_SECTION,
    ScopeRow,
    scope_keys,
)
from memstore.storage.sql.maintenance import erase as maintenance
from memstore.storage.sql.queue import table as queue_table
from memstore.storage.sql.queue.table import QueueLease
from memstore.storage.sql.schema.models import sections_table


def late_write(
    conn: Connection,
    tenant_id: str,
    scope: Scope,
    scope_row: ScopeRow,
    incoming: IncomingDocument,
    captured_at: datetime | None,
    *,
    created: bool,
) -> str | None:
    """Why this save must not land (it would bring back erased or purged memory), or None."""
    revision = incoming.revision
    if incoming.incarnation is not None and incoming.incarnation != incarnation(
        stamp_of(scope_row, scope_row.revision)
    ):
        return f"the document was loaded at revision {revision}, before the scope was erased"
    if revision is not None and revision > scope_row.revision:
        if created:
            return f"the document was loaded at revision {revision} but the scope was erased since"
        return f"the document carries revision {revision} but the store is at {scope_row.revision} (erased)"
    if revision is not None and revision < scope_row.purged_revision:
        return (
            f"the document was loaded at revision {revision}, before tombstones up to revision "
            f"{scope_row.purged_revision} were vacuumed"
        )
    if captured_at is None:
        return None
    cleared = as_utc(scope_row.cleared_at)
    if cleared is not None and cleared > captured_at:
        return "the scope was cleared after the conversation was captured"
    erased = as_utc(maintenance.erased_at(conn, scope[0], tenant_id)) if scope[0] is not None else None
    if erased is not None and erased > captured_at:
        return "the user was erased after the conversation was captured"
    return None


def plan_save(
    conn: Connection,
    scope_row: ScopeRow,
    incoming: IncomingDocument,
    cached: CacheEntry | None,
    cap: Cap,
    read_signals: Callable[[], Mapping[str, FactSignals]],
) -> MergePlan:
    """Plan against the cached snapshot if store and caller are both at its revision, else the rows."""
    current = scope_row.revision
    if cached is not None and incoming.revision == current and cached.stamp == stamp_of(scope_row, current):
        plan = plan_from_snapshot(
            incoming,
            cached.snapshot,
            current=current,
            stored_version=scope_row.version,
            cap=cap,
            read_signals=read_signals,
        )
        if plan is not None:
            return plan
    scope_id = scope_row.scope_id
    sections = {
        row.section: StoredSection(
            SectionValues(row.summary, as_utc(row.updated_at), json_object(row.extra)), row.revision
        )
        for row in conn.execute(SECTIONS_QUERY, {"scope_id": scope_id})
    }
    fact_ids = [fact.values.fact_id for fact in incoming.facts or ()]
    rows = list(conn.execute(FACTS_QUERY, {"scope_id": scope_id, "fact_ids": fact_ids[:MAX_BOUND_IDS]}))
    for ids in _chunks(fact_ids[MAX_BOUND_IDS:]):
        rows.extend(conn.execute(TOMBSTONES_QUERY, {"scope_id": scope_id, "fact_ids": ids}))
    grants = _stored_grants(conn, scope_id) if any(row.visibility == SHARED for row in rows) else {}
    tags, relations = stored_links(conn, scope_id)
    facts = [
        StoredFact(
            row_id=row.id,
            values=_fact_values(row, grants.get(row.fact_id, ()), tags, relations),
            position=row.position,
            added_revision=row.added_revision,
            updated_revision=row.updated_revision,
            deleted_revision=row.deleted_revision,
            signals=FactSignals(
                as_utc(row.last_confirmed_at), as_utc(row.last_accessed_at), row.access_count
            ),
        )
        for row in rows
    ]
    return plan_merge(
        incoming,
        stored_facts=facts,
        stored_sections=sections,
        stored_version=scope_row.version,
        current=current,
        cap=cap,
        new_id=new_fact_id,
    )


def refuse_unauthorised_sharing(plan: MergePlan, roles: frozenset[str]) -> None:
    """``AccessDeniedError`` when the save would share a fact, or change whom it is shared with,
    for a handle without ``editor`` or ``admin``: the rule holds for every writer (the DeerFlow
    adapters, a direct save), not only for the fact helpers that check it first. Keeping a fact
    as it was, or making it private, needs no role; the LLM's updates write private facts only."""
    if roles & SHARING_ROLES:
        return
    for values, _ in plan.inserts:
        if values.visibility != PRIVATE:
            raise AccessDeniedError(f"fact {values.fact_id}: sharing a fact needs the role editor or admin")
    for values, _ in plan.updates:
        if values.visibility == PRIVATE:
            continue
        before = fact_access(plan.fact_before.get(values.fact_id, {}))
        if before != (values.visibility, values.grants):
            raise AccessDeniedError(
                f"fact {values.fact_id}: changing whom a fact is shared with needs the role editor or admin"
            )


def complete_leased(transaction: RootTransaction, conn: Connection, lease: QueueLease, now: datetime) -> None:
    """Complete the queued row in the save's transaction, or roll it back if the lease is lost."""
    if not queue_table.complete(conn, lease, now=now):
        transaction.rollback()
        raise LeaseLostError(
            f"queued conversation {lease.row_id} was taken over by another worker; "
            "its update is theirs to save"
        )
    lease.settled = True


def _stored_grants(conn: Connection, scope_id: int) -> dict[str, Grants]:
    found: dict[str, list[tuple[str, str]]] = {}
    for fact_id, kind, grantee in conn.execute(GRANTS_QUERY, {"scope_id": scope_id}):
        found.setdefault(fact_id, []).append((kind, grantee))
    return {fact_id: tuple(sorted(pairs)) for fact_id, pairs in found.items()}


def write_grants(conn: Connection, tenant_id: str, scope_id: int, written: Sequence[FactValues]) -> None:
    """Replace the grants of the shared facts a save wrote. A fact that stopped being shared keeps
    its old grant rows, inert: every policy and query reads grants only for shared facts."""
    shared = [values for values in written if values.visibility == SHARED]
    if not shared:
        return
    conn.execute(DELETE_GRANTS, [{"b_scope_id": scope_id, "b_fact_id": values.fact_id} for values in shared])
    rows = [
        {
            "b_scope_id": scope_id,
            "b_fact_id": values.fact_id,
            "b_kind": kind,
            "b_grantee": grantee,
            "b_tenant_id": tenant_id,
        }
        for values in shared
        for kind, grantee in values.grants
    ]
    if rows:
        conn.execute(INSERT_GRANT, rows)


def apply_plan(
    conn: Connection, tenant_id: str, scope_id: int, plan: MergePlan, now: datetime, origin: str
) -> bool:
    """Write the plan: tombstones first, so a re-added content key never meets its old live row.

    False when the stored rows differ from the plan's document (a relation to a fact the scope does
    not hold was left out), so the caller must not cache it."""
    revision = plan.revision
    for ids in _chunks(plan.tombstones):
        conn.execute(
            TOMBSTONE_FACTS, {"b_scope_id": scope_id, "b_fact_ids": ids, "b_revision": revision, "b_now": now}
        )
    clear_tombstoned_links(conn, scope_id, plan)
    if plan.updates:
        conn.execute(UPDATE_FACT, [_fact_row(scope_id, v, pos, revision) for v, pos in plan.updates])
    if plan.moves:
        conn.execute(
            MOVE_FACT,
            [
                {"b_scope_id": scope_id, "b_fact_id": fact_id, "b_position": pos}
                for fact_id, pos in plan.moves
            ],
        )
    if plan.inserts:
        RUN_INSERT_FACTS[conn.dialect.name].run(
            conn,
            [
                {
                    "scope_id": scope_id,
                    "tenant_id": tenant_id,
                    "fact_id": values.fact_id,
                    **_columns(values),
                    "position": position,
                    "added_revision": revision,
                    "updated_revision": revision,
                }
                for values, position in plan.inserts
            ],
        )
    write_grants(conn, tenant_id, scope_id, [values for values, _ in (*plan.updates, *plan.inserts)])
    exact = write_links(conn, tenant_id, scope_id, plan)
    if plan.section_inserts:
        conn.execute(
            insert(sections_table),
            [
                {
                    "scope_id": scope_id,
                    "section": name,
                    "summary": values.summary,
                    "updated_at": values.updated_at,
                    "extra": values.extra,
                    "revision": revision,
                }
                for name, values in plan.section_inserts
            ],
        )
    if plan.section_updates:
        conn.execute(
            UPDATE_SECTION,
            [
                {
                    "b_scope_id": scope_id,
                    "b_section": name,
                    "b_summary": values.summary,
                    "b_updated_at": values.updated_at,
                    "b_extra": values.extra,
                    "b_revision": revision,
                }
                for name, values in plan.section_updates
            ],
        )
    changes = plan.changes  # derived from the plan each time it is read: read once
    if changes:
        RUN_INSERT_HISTORY.run(
            conn,
            [
                {
                    "b_scope_id": scope_id,
                    "b_revision": revision,
                    "b_now": now,
                    "b_entity": change.entity,
                    "b_entity_id": change.entity_id,
                    "b_action": change.action,
                    "b_origin": origin,
                    "b_before": change.before,
                    "b_after": change.after,
                    "b_detail": change.detail,
                }
                for change in changes
            ],
        )
    return exact


def confirm_facts(conn: Connection, scope_id: int, fact_ids: list[str], now: datetime) -> None:
    """Stamp ``last_confirmed_at`` on the live facts an update re-stated (no revision, no audit)."""
    for ids in _chunks(fact_ids):
        conn.execute(CONFIRM_FACTS, {"b_scope_id": scope_id, "b_fact_ids": ids, "b_now": now})


def audit_folds(
    conn: Connection,
    scope_id: int,
    revision: int,
    now: datetime,
    origin: str,
    folded: Mapping[str, Sequence[Mapping[str, Any]]],
) -> None:
    """One audit row per new fact folded into a live one (``update.similarity``): the fact is unchanged
    unless its confidence rose, which the plan's own row records."""
    conn.execute(
        INSERT_HISTORY,
        [
            {
                "b_scope_id": scope_id,
                "b_revision": revision,
                "b_now": now,
                "b_entity": "fact",
                "b_entity_id": fact_id,
                "b_action": "update",
                "b_origin": origin,
                "b_before": None,
                "b_after": None,
                "b_detail": dict(detail),
            }
            for fact_id, details in folded.items()
            for detail in details
        ],
    )


def vanished_fold_targets(plan: MergePlan, folded: Mapping[str, object] | None) -> set[str]:
    """Fold targets the merged result no longer holds: another writer deleted them."""
    if not folded:
        return set()
    return folded.keys() - {values.fact_id for values in plan.facts}


def annotate_deletions(
    conn: Connection, tenant_id: str, scope: Scope, details: Mapping[str, Mapping[str, Any]]
) -> None:
    """Put ``details`` on the deletions the scope's latest save made (``ANNOTATE_DELETION``)."""
    keys = scope_keys(scope, tenant_id)
    rows = [{**keys, "b_fact_id": fact_id, "b_detail": dict(detail)} for fact_id, detail in details.items()]
    conn.execute(ANNOTATE_DELETION, rows)


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    """``ids`` in slices small enough to bind into one statement (``MAX_BOUND_IDS``)."""
    for start in range(0, len(ids), MAX_BOUND_IDS):
        yield ids[start : start + MAX_BOUND_IDS]


def _columns(values: FactValues) -> dict[str, Any]:
    record = values.fields
    return {
        "memory_type": record.memory_type,
        "importance": record.importance,
        "source_kind": record.source_kind,
        "raw": record.raw,
        "structured": record.structured,
        "content": values.content,
        "content_key": values.content_key,
        "category": values.category,
        "confidence": values.confidence,
        "created_at": values.created_at,
        "source": values.source,
        "source_error": values.source_error,
        "extra": values.extra,
        "visibility": values.visibility,
    }


def _fact_row(scope_id: int, values: FactValues, position: int, revision: int) -> dict[str, Any]:
    params = {"b_" + name: value for name, value in _columns(values).items()}
    params.update(
        b_scope_id=scope_id, b_fact_id=values.fact_id, b_position=position, b_updated_revision=revision
    )
    return params


def _fact_values(
    row: AnyRow, grants: Grants, tags: Mapping[str, tuple[str, ...]], relations: Mapping[str, Relations]
) -> FactValues:
    return FactValues(
        fact_id=row.fact_id,
        content=row.content,
        category=row.category,
        confidence=row.confidence,
        created_at=as_utc(row.created_at),
        source=row.source,
        source_error=row.source_error,
        extra=json_object(row.extra),
        visibility=row.visibility,
        grants=grants,
        record=record_of_row(row, tags.get(row.fact_id, ()), relations.get(row.fact_id, ())),
    )
