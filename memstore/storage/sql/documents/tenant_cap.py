"""``tenant_max_facts``: one tenant's live facts, across all its users, capped (fair use per tenant).

Checked in the save's transaction when it adds facts. Under PostgreSQL's row-level security the
application's role counts only the facts it may read, so the count then runs on the operator's
connection: a cap must see the whole tenant. Concurrent saves of one tenant can each pass at the
cap's edge, so a tenant may end a few facts over it, never more than one save's additions each.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, func, select

from memstore.errors import TenantQuotaError
from memstore.storage.sql.documents.merge import MergePlan
from memstore.storage.sql.identity import policies_apply
from memstore.storage.sql.maintenance.operator import operator_engine
from memstore.storage.sql.schema.models import facts_table as _facts


def refuse_over_cap(
    conn: Connection, engine: Engine, tenant_id: str, plan: MergePlan, cap: int | None
) -> None:
    """``TenantQuotaError`` when the save would leave the tenant with more than ``cap`` live facts."""
    grows = len(plan.inserts) - len(plan.tombstones)
    if cap is None or grows <= 0:
        return
    count = select(func.count()).where(_facts.c.tenant_id == tenant_id, _facts.c.deleted_revision.is_(None))
    if policies_apply(engine, conn):
        with operator_engine(engine, "the tenant fact cap").connect() as operator:
            live = int(operator.execute(count).scalar_one())
    else:
        live = int(conn.execute(count).scalar_one())
    if live + grows > cap:
        raise TenantQuotaError(
            f"tenant {tenant_id} holds {live} live facts and tenant_max_facts is {cap}: "
            f"{grows} more would pass it (remove facts, or raise the cap)"
        )
