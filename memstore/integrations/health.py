"""``/healthz`` and ``/readyz`` for a gateway's FastAPI app, and for ``memstore serve``.

``/healthz`` says the process answers; ``/readyz`` runs ``memstore.ops.health.readiness`` and
answers 503 until the database answers and its schema is at head, so a load balancer sends no
traffic to a replica whose database is down or behind a migration. The durable queue's lag is in
the body (``queue``) but never makes the API unready: a backlog is the workers' problem, to alert
on, not a reason to stop serving. Neither needs an identity nor shows any memory.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from memstore.ops.health import readiness
from memstore.storage.base import MemoryStorage


def create_health_router(storage: MemoryStorage | None = None) -> APIRouter:
    """The two probes, at the app's root; ``storage`` defaults to the configured one."""
    router = APIRouter(tags=["health"])

    @router.get("/healthz", summary="The process answers")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get(
        "/readyz",
        summary="Database reachable and at head; the queue's lag is reported, not checked",
        responses={503: {"description": "A check failed; the body says which"}},
    )
    async def readyz() -> JSONResponse:
        answer = await run_in_threadpool(readiness, storage)  # the checks block on the database
        body: dict[str, Any] = {
            "status": "ready" if answer.ready else "not ready",
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in answer.checks],
        }
        if answer.queue is not None:
            body["queue"] = {"ok": answer.queue.ok, "detail": answer.queue.detail}
        return JSONResponse(body, status_code=200 if answer.ready else 503)

    return router
