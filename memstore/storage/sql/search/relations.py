"""A fact's relations both ways (``memory_fact_relations``), read inside its own scope.

A relation names two facts of one scope by id, so both directions are one indexed statement each:
the primary key serves the outgoing ones, ``ix_memory_fact_relations_scope_id_target_fact_id``
the incoming ones. The other end may be a tombstone (a superseded fact is usually deleted), which
``Relation.live`` says.
"""

from __future__ import annotations

from sqlalchemy import and_, select

from memstore.scope import Scope
from memstore.storage.records import FactRelations, Relation
from memstore.storage.sql.documents.statements import SCOPE_ID, scope_keys
from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.schema.models import relations_table as _relations
from memstore.storage.sql.search.visibility import Connect


def fact_relations(engine: Connect, tenant_id: str, scope: Scope, fact_id: str) -> FactRelations:
    """``fact_id``'s relations in ``scope`` of ``tenant_id``: none when the scope or fact is unknown."""
    found = FactRelations(fact_id)
    with engine() as conn:
        for this_end, other_end, into in (
            (_relations.c.fact_id, _relations.c.target_fact_id, found.outgoing),
            (_relations.c.target_fact_id, _relations.c.fact_id, found.incoming),
        ):
            other = _facts.alias("other")
            query = (
                select(_relations.c.kind, other_end.label("other_id"), other.c.deleted_revision)
                .select_from(
                    _relations.join(
                        other, and_(other.c.scope_id == _relations.c.scope_id, other.c.fact_id == other_end)
                    )
                )
                .where(_relations.c.scope_id == SCOPE_ID, this_end == fact_id)
                .order_by(_relations.c.kind, other_end)
            )
            into.extend(
                Relation(row.kind, row.other_id, live=row.deleted_revision is None)
                for row in conn.execute(query, scope_keys(scope, tenant_id))
            )
    return found
