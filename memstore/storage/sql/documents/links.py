"""A fact's tags and relations: rows of their own, written with the fact by a save.

Both are replaced as a whole when a save writes a fact that has (or had) any, and dropped when a
save tombstones it: a tombstoned fact is out of every tag query, and only the relations pointing
*at* it stay (a correction that superseded it, a merge derived from it). A relation whose target
is not a fact of the scope is not stored (``INSERT_RELATION`` selects the target), and is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from memstore.storage.sql.documents.codec import FactValues, IncomingDocument, IncomingFact, Record, Relations
from memstore.storage.sql.documents.json_values import json_object
from memstore.storage.sql.documents.statements import (
    DELETE_OUTGOING,
    DELETE_RELATIONS,
    DELETE_TAGS,
    DELETE_TOMBSTONED_TAGS,
    INSERT_RELATION,
    INSERT_TAG,
    MAX_BOUND_IDS,
    RELATIONS_QUERY,
    STORED_IDS,
    TAGS_QUERY,
)

if TYPE_CHECKING:
    from memstore.storage.sql.documents.merge import MergePlan

logger = logging.getLogger(__name__)

_RECORD = attrgetter("values.record")


def with_known_targets(
    conn: Connection, scope_id: int | None, incoming: IncomingDocument
) -> IncomingDocument:
    """``incoming`` without the relations whose target is no fact of the scope (live, deleted or in
    ``incoming`` itself), logged: dropped before planning, so no version or audit row claims them."""
    facts = incoming.facts
    # A fact with the default record (nearly all) has no relations: only the others are looked at,
    # and not the stored facts the document kept as they are (``kept``): their targets are stored.
    records = filter(None, map(_RECORD, (facts or [])[incoming.kept :]))
    targets = {target for record in records for _, target in record.relations}
    if not facts or not targets:
        return incoming
    known = {fact.values.fact_id for fact in facts}
    asked = sorted(targets - known)
    if scope_id is not None:
        for start in range(0, len(asked), MAX_BOUND_IDS):
            found = conn.execute(
                STORED_IDS, {"scope_id": scope_id, "fact_ids": asked[start : start + MAX_BOUND_IDS]}
            )
            known.update(found.scalars())
    if targets <= known:
        return incoming
    kept: list[IncomingFact] = []
    for fact in facts:
        record = fact.values.record
        if record is None or all(target in known for _, target in record.relations):
            kept.append(fact)
            continue
        relations = tuple(pair for pair in record.relations if pair[1] in known)
        narrowed = replace(record, relations=relations)
        values = replace(
            fact.values, record=None if narrowed.is_default_for(fact.values.category) else narrowed
        )
        kept.append(IncomingFact(values, fact.generated_id))
    logger.warning(
        "memstore: %d relation target(s) name no fact of this scope; those relations were not stored",
        len(targets - known),
    )
    return replace(incoming, facts=kept)


def record_of_row(row: Any, tags: tuple[str, ...], relations: Relations) -> Record | None:
    """The record of a stored fact row (``FACTS_QUERY``); None when it is all defaults."""
    structured = row.structured
    record = Record(
        memory_type=row.memory_type,
        importance=row.importance,
        source_kind=row.source_kind,
        raw=row.raw,
        structured=json_object(structured) if structured is not None else None,
        tags=tags,
        relations=relations,
    )
    return None if record.is_default_for(row.category) else record


def stored_links(conn: Connection, scope_id: int) -> tuple[dict[str, tuple[str, ...]], dict[str, Relations]]:
    """Every tag and relation of the scope's facts, by fact id, sorted as the codec keeps them."""
    tags: dict[str, list[str]] = {}
    for fact_id, tag in conn.execute(TAGS_QUERY, {"scope_id": scope_id}):
        tags.setdefault(fact_id, []).append(tag)
    relations: dict[str, list[tuple[str, str]]] = {}
    for fact_id, kind, target in conn.execute(RELATIONS_QUERY, {"scope_id": scope_id}):
        relations.setdefault(fact_id, []).append((kind, target))
    return (
        {fact_id: tuple(sorted(found)) for fact_id, found in tags.items()},
        {fact_id: tuple(sorted(found)) for fact_id, found in relations.items()},
    )


def clear_tombstoned_links(conn: Connection, scope_id: int, plan: MergePlan) -> None:
    """Drop the tags and outgoing relations of the facts the save tombstoned, if they had any."""
    linked = [
        fact_id
        for fact_id in plan.tombstones
        if (before := plan.fact_before.get(fact_id)) is not None and _has_links(before)
    ]
    for start in range(0, len(linked), MAX_BOUND_IDS):
        ids = linked[start : start + MAX_BOUND_IDS]
        params = {"b_scope_id": scope_id, "b_fact_ids": ids}
        conn.execute(DELETE_TOMBSTONED_TAGS, params)
        conn.execute(DELETE_OUTGOING, params)


def write_links(conn: Connection, tenant_id: str, scope_id: int, plan: MergePlan) -> bool:
    """Replace the tags and relations of each fact the save wrote that has, or had, any.

    False when a relation was left out (its target is no fact of the scope)."""
    written: list[FactValues] = [
        values
        for values, _ in (*plan.updates, *plan.inserts)
        if values.fields.tags
        or values.fields.relations
        or _has_links(plan.fact_before.get(values.fact_id) or {})
    ]
    if not written:
        return True
    keys = [{"b_scope_id": scope_id, "b_fact_id": values.fact_id} for values in written]
    conn.execute(DELETE_TAGS, keys)
    conn.execute(DELETE_RELATIONS, keys)
    tags = [
        {"b_scope_id": scope_id, "b_fact_id": values.fact_id, "b_tag": tag, "b_tenant_id": tenant_id}
        for values in written
        for tag in values.fields.tags
    ]
    if tags:
        conn.execute(INSERT_TAG, tags)
    relations = [
        {
            "b_scope_id": scope_id,
            "b_fact_id": values.fact_id,
            "b_kind": kind,
            "b_target": target,
            "b_tenant_id": tenant_id,
        }
        for values in written
        for kind, target in values.fields.relations
    ]
    stored = sum(len(conn.execute(INSERT_RELATION, relation).all()) for relation in relations)
    if stored < len(relations):
        logger.warning(
            "memstore: %d relation(s) name a fact this scope does not hold and were not stored",
            len(relations) - stored,
        )
    return stored == len(relations)


def _has_links(fact: Mapping[str, Any]) -> bool:
    return bool(fact.get("tags")) or bool(fact.get("relations"))
