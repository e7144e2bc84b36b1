"""Prometheus metrics: what a fleet's dashboards read from memstore (``prometheus-client``).

Every series lives in ``REGISTRY``, memstore's own registry, so the host decides where it is
exposed: ``memstore serve`` and ``integrations.metrics.create_metrics_router()`` answer
``/metrics``, and any other framework serves ``integrations.metrics.render_metrics()``. No label
carries a user id, an agent name or any content: labels are operation names and outcomes from
fixed sets, so a series count never grows with users.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Literal, ParamSpec, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

# Loads and saves take milliseconds; an outage's timeouts take seconds.
_STORAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_LLM_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)

STORAGE_OPERATIONS = Counter(
    "memstore_storage_operations",
    "Loads and saves of a memory document, by outcome: ok, failed (the save was refused), error",
    ["operation", "outcome"],
    registry=REGISTRY,
)
STORAGE_SECONDS = Histogram(
    "memstore_storage_operation_seconds",
    "Time of a load or save of a memory document",
    ["operation"],
    buckets=_STORAGE_BUCKETS,
    registry=REGISTRY,
)
LLM_CALLS = Counter(
    "memstore_llm_calls",
    "Chat completions for memory updates, by outcome: ok, error",
    ["outcome"],
    registry=REGISTRY,
)
LLM_SECONDS = Histogram(
    "memstore_llm_call_seconds",
    "Time of a chat completion for a memory update, retries included",
    buckets=_LLM_BUCKETS,
    registry=REGISTRY,
)
EXTRACTIONS = Counter(
    "memstore_extractions",
    "Conversations through the updater: updated (saved), skipped (nothing to learn), failed",
    ["outcome"],
    registry=REGISTRY,
)
QUEUE_REJECTED = Counter(
    "memstore_queue_rejected",
    "Conversations the queue refused, by reason: full (max_queue_depth or max_queue_chars), "
    "user_share (the user's queue_user_share of them), tenant_share (the tenant's queue_tenant_share), "
    "invalid (the database refused the content)",
    ["reason"],
    registry=REGISTRY,
)
FACTS_EVICTED = Counter(
    "memstore_facts_evicted", "Facts removed at max_facts to make room for new ones", registry=REGISTRY
)

StorageOperation = Literal["load", "save"]
P = ParamSpec("P")
R = TypeVar("R")


def timed_storage(operation: StorageOperation) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a provider's load or save: its time, and its outcome (a save returning False: failed).

    The labelled children are looked up once, here: ``labels()`` per call cost more than the rest.
    """
    seconds = STORAGE_SECONDS.labels(operation)
    ok, failed, error = (
        STORAGE_OPERATIONS.labels(operation, outcome) for outcome in ("ok", "failed", "error")
    )

    def decorate(method: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(method)
        def timed(*args: P.args, **kwargs: P.kwargs) -> R:
            started = time.perf_counter()
            outcome = error
            try:
                result = method(*args, **kwargs)
                outcome = failed if result is False else ok
                return result
            finally:
                seconds.observe(time.perf_counter() - started)
                outcome.inc()

        return timed

    return decorate


def count_rejection(stat: str) -> None:
    """Count a queue's ``rejected_*`` stat in ``memstore_queue_rejected``; other stats are not series."""
    if stat.startswith("rejected_"):
        QUEUE_REJECTED.labels(stat.removeprefix("rejected_")).inc()
