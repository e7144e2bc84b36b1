"""The console's JSON about operations: the durable queue (status, rows, charts, retry and purge)
and the lifecycle (the dry run, and applying it).

The queue crosses tenants, so only the default tenant's admin sees it (``Operator.require_operator``).
A lifecycle run is scoped to a tenant (every tenant: the operator's ``tenant=*``) and optionally one
user. Applying takes the dry run's own instant and threshold, so it scores the facts as the page
showed them, and the number of facts the operator confirmed: when a fresh dry run at that instant
no longer finds that many (a fact was imported, edited or used in between), nothing is removed and
the page is told to run it again.
"""

from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from memstore.console.directory import directory_engine
from memstore.console.errors import console_errors
from memstore.console.inputs import MAX_OFFSET, Offset, RowId, row_id
from memstore.console.queue_view import MAX_QUEUE_PAGE, QUEUE_STATES, last_hour, queue_rows
from memstore.console.security import Operator, check_mutation
from memstore.integrations.fastapi_errors import MemoryRoute
from memstore.ops.lifecycle import LifecycleReport, run_lifecycle
from memstore.ops.queue import purge_counts, purge_dead, queue_status, retry_dead
from memstore.scope import validate_user_id
from memstore.storage.loader import get_memory_storage
from memstore.storage.records import iso

ALL_TENANTS = "*"
MAX_EXPIRING_SHOWN = 500
MAX_APPLY_AGE = timedelta(hours=1)
"""A dry run older than this is not applied: run it again and look at what it says now."""
MAX_IDS = 1000


class DeadRows(BaseModel):
    """Which dead rows: ``ids``, or every dead row with ``all``."""

    model_config = ConfigDict(extra="forbid")

    ids: list[RowId] | None = Field(default=None, max_length=MAX_IDS)
    all: bool = False

    def chosen(self) -> list[int] | None:
        if self.all == (self.ids is not None):
            raise HTTPException(422, "name the rows: ids, or all")
        return self.ids


class LifecycleApply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str | None = None
    user: str | None = None
    below: float = Field(ge=0, le=1)
    evaluated_at: datetime
    expiring: int = Field(ge=0, le=MAX_OFFSET)
    """How many facts the dry run listed, which the operator confirmed expiring."""


def _report(report: LifecycleReport) -> dict[str, Any]:
    return report.to_json(MAX_EXPIRING_SHOWN)


def _tenant_of(me: Operator, tenant: str | None) -> str | None:
    """The lifecycle's tenant: ``*`` (every tenant) for the operator only."""
    if tenant == ALL_TENANTS:
        me.require_operator("a lifecycle run over every tenant")
        return None
    return me.tenant(tenant)


def ops_router(operator: Callable[..., Operator]) -> APIRouter:
    router = APIRouter(route_class=MemoryRoute)
    caller = Depends(operator)

    @router.get("/queue")
    def queue(
        me: Operator = caller,
        state: str = "dead",
        limit: int = Query(default=50, ge=1, le=MAX_QUEUE_PAGE),
        offset: Offset = 0,
    ) -> dict[str, Any]:
        me.require_operator("the queue")
        if state not in QUEUE_STATES:
            raise HTTPException(422, f"state must be one of {', '.join(QUEUE_STATES)}")
        with console_errors(me):
            status = queue_status()
            engine = directory_engine(get_memory_storage(), "the console's queue view")
            rows = queue_rows(engine, state, tenant_id=None, limit=limit, offset=offset)
            series = last_hour(engine, datetime.now(UTC))
        summary = asdict(status)
        summary.pop("dead_rows")
        return {
            "status": summary,
            "state": state,
            "page": rows,
            "series": [minute.to_json() for minute in series],
        }

    @router.get("/queue/purge-preview")
    def purge_preview(
        me: Operator = caller, ids: str | None = Query(default=None, max_length=20_000)
    ) -> dict[str, Any]:
        me.require_operator("the queue")
        chosen = _ids(ids)
        with console_errors(me):
            counts = purge_counts(chosen)
        return {
            "conversations": [
                {"state": state, "user_id": user or None, "rows": rows} for state, user, rows in counts
            ]
        }

    @router.post("/queue/retry", dependencies=[Depends(check_mutation)])
    def retry(rows: DeadRows, me: Operator = caller) -> dict[str, Any]:
        me.require_operator("the queue")
        with console_errors(me):
            return {"retried": retry_dead(rows.chosen())}

    @router.post("/queue/purge", dependencies=[Depends(check_mutation)])
    def purge(rows: DeadRows, me: Operator = caller) -> dict[str, Any]:
        me.require_operator("the queue")
        with console_errors(me):
            return {"purged": purge_dead(rows.chosen())}

    @router.get("/lifecycle")
    def lifecycle_dry_run(
        me: Operator = caller,
        tenant: str | None = None,
        user: str | None = Query(default=None, max_length=128),
        below: float | None = Query(default=None, ge=0, le=1),
    ) -> dict[str, Any]:
        with console_errors(me):
            report = run_lifecycle(
                dry_run=True,
                user_id=validate_user_id(user or None),
                threshold=below,
                tenant_id=_tenant_of(me, tenant),
            )
        return _report(report)

    @router.post("/lifecycle/apply", dependencies=[Depends(check_mutation)])
    def lifecycle_apply(run: LifecycleApply, me: Operator = caller) -> dict[str, Any]:
        evaluated_at = run.evaluated_at if run.evaluated_at.tzinfo else run.evaluated_at.replace(tzinfo=UTC)
        now = datetime.now(UTC)
        if not now - MAX_APPLY_AGE <= evaluated_at <= now:
            raise HTTPException(422, "that dry run is over an hour old (or in the future): run it again")
        with console_errors(me):
            user, tenant_id = validate_user_id(run.user or None), _tenant_of(me, run.tenant)

            def lifecycle(dry_run: bool) -> LifecycleReport:
                return run_lifecycle(
                    dry_run=dry_run, user_id=user, threshold=run.below, tenant_id=tenant_id, now=evaluated_at
                )

            found = len(lifecycle(dry_run=True).expiring)
            if found != run.expiring:
                raise HTTPException(
                    409,
                    f"the facts changed since that dry run: {found} would expire now, not "
                    f"{run.expiring}. Nothing was removed: run the dry run again",
                )
            report = lifecycle(dry_run=False)
        return {**_report(report), "applied_at": iso(now)}

    return router


def _ids(text: str | None) -> list[int] | None:
    """``1,2,3`` as row ids; absent is every dead row."""
    if text is None or text == "":
        return None
    parts = text.split(",")
    if len(parts) > MAX_IDS:
        raise HTTPException(422, f"at most {MAX_IDS} ids")
    return [row_id(part) for part in parts]
