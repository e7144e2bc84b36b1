"""``/metrics`` in Prometheus' text format: memstore's series plus the durable queue's gauges.

The counters and histograms (``memstore.metrics``) count what this process did. The queue's
gauges (pending, leased and dead conversations, the oldest waiting turn's age) describe the
shared database, so they are read from it at each scrape. A scrape that cannot read them leaves
them out and logs why at WARNING; the process's own series are served all the same.

``create_metrics_router()`` mounts it on a FastAPI app (``memstore serve`` does); a gateway on
another framework answers its own ``/metrics`` with ``render_metrics()``, and ``memstore worker
--metrics-port`` serves it on its own. FastAPI is imported only by the router, so neither of
those needs the ``server`` extra.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from memstore.config import get_memory_config
from memstore.errors import MigrationError, StorageUnavailableError
from memstore.metrics import REGISTRY
from memstore.ops.queue import queue_status
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.sql.documents.provider import SqlMemoryStorage

if TYPE_CHECKING:
    from fastapi import APIRouter

logger = logging.getLogger(__name__)


class _QueueGauges(Collector):
    def __init__(self, storage: MemoryStorage | None) -> None:
        self._storage = storage

    def collect(self) -> Iterator[Metric]:
        storage = self._storage or get_memory_storage()
        if not isinstance(storage, SqlMemoryStorage) or get_memory_config().queue_backend == "memory":
            return
        try:
            status = queue_status(storage)
        except (StorageUnavailableError, MigrationError) as exc:
            logger.warning("metrics: the queue gauges are left out, cannot read the queue: %s", exc)
            return
        gauges = (
            ("memstore_queue_pending", "Queued conversations waiting for a worker", status.pending),
            ("memstore_queue_leased", "Queued conversations a worker is processing", status.leased),
            (
                "memstore_queue_dead",
                "Queued conversations that failed for good (memstore queue retry)",
                status.dead,
            ),
            (
                "memstore_queue_oldest_pending_seconds",
                "Age of the oldest waiting turn, 0 when none: the queue's lag",
                status.oldest_pending_seconds or 0.0,
            ),
        )
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(name, documentation, value=value)


def render_metrics(storage: MemoryStorage | None = None) -> tuple[bytes, str]:
    """The exposition body and its content type; ``storage`` defaults to the configured one."""
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(_QueueGauges(storage))
    return generate_latest(REGISTRY) + generate_latest(scrape), CONTENT_TYPE_LATEST


def create_metrics_router(storage: MemoryStorage | None = None) -> APIRouter:
    """``GET /metrics`` at the app's root: no identity, and no label that names a user or a fact."""
    from fastapi import APIRouter
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import Response

    router = APIRouter(tags=["health"])

    # response_model=None: the return annotation is a string naming a lazily imported class.
    @router.get("/metrics", summary="Prometheus metrics", response_class=Response, response_model=None)
    async def metrics() -> Response:
        body, content_type = await run_in_threadpool(render_metrics, storage)  # the gauges query
        return Response(body, media_type=content_type)

    return router
