"""Expiry: remove the facts whose decay score fell under ``expire_below`` (``memstore lifecycle run``).

A run scores every live fact of the chosen users at one instant (``memstore.retention``: decay is
``confidence * max(freshness, heat)``; protected categories never expire), then removes the
expiring ones scope by scope. Each removal is an ordinary merge-safe save of the scope as just
re-read, with origin ``lifecycle`` and the fact's decay score in the audit ``detail``: a save
racing the run keeps its own changes, and a stale document cannot bring an expired fact back
(its tombstone is newer than what that document loaded). A dry run stops after scoring.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from memstore.config import get_memory_config
from memstore.document import format_timestamp
from memstore.errors import ConfigError, StorageWriteError
from memstore.ops.queries import operations_of
from memstore.retention import NO_SIGNALS, RetentionPolicy, Score, candidate_of
from memstore.scope import validate_user_id
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.records import MAX_PAGE_SIZE, FactFilter
from memstore.storage.sql.provider import SqlMemoryStorage

logger = logging.getLogger(__name__)

LIFECYCLE_ORIGIN = "lifecycle"


@dataclass(frozen=True)
class ExpiringFact:
    user_id: str | None
    agent_name: str | None
    fact_id: str
    category: str
    content: str
    decay: Score

    def to_json(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "agent_name": self.agent_name,
            "fact_id": self.fact_id,
            "category": self.category,
            "content": self.content,
            **self.decay.detail("expired"),
        }


@dataclass(frozen=True)
class LifecycleReport:
    """What a run found under the threshold, and how many of those it removed (0 on a dry run)."""

    threshold: float
    evaluated_at: datetime
    scopes_scanned: int
    expiring: list[ExpiringFact] = field(default_factory=list)
    removed: int = 0
    dry_run: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "evaluated_at": self.evaluated_at.isoformat(),
            "scopes_scanned": self.scopes_scanned,
            "dry_run": self.dry_run,
            "removed": self.removed,
            "expiring": [fact.to_json() for fact in self.expiring],
        }


RETENTION_KEYS = ("lastConfirmedAt", "lastAccessedAt", "accessCount", "retentionScore")
"""Read-only keys ``with_retention`` adds to fact objects (never stored in a document)."""


def with_retention(
    facts: list[dict[str, Any]],
    *,
    agent_name: str | None = None,
    user_id: str | None = None,
    storage: MemoryStorage | None = None,
) -> list[dict[str, Any]]:
    """Copies of a scope's ``facts`` with their retention signals and eviction score, for display.

    The file provider keeps no signals: its facts show no accesses and a score from confidence
    and age alone.
    """
    store = storage if storage is not None else get_memory_storage()
    signals = store.fact_signals(agent_name, user_id=user_id) if isinstance(store, SqlMemoryStorage) else {}
    policy, now = RetentionPolicy.of(get_memory_config()), datetime.now(UTC)
    shown = []
    for index, fact in enumerate(facts):
        fact_id = fact.get("id")
        signal = signals.get(fact_id, NO_SIGNALS) if isinstance(fact_id, str) else NO_SIGNALS
        score = policy.score(candidate_of(fact, signal, index), now)
        shown.append(
            {
                **fact,
                "lastConfirmedAt": _iso(signal.last_confirmed_at),
                "lastAccessedAt": _iso(signal.last_accessed_at),
                "accessCount": signal.access_count,
                "retentionScore": round(score.value, 6),
            }
        )
    return shown


def _iso(value: datetime | None) -> str | None:
    return None if value is None else format_timestamp(value)


def find_expiring(
    *,
    user_id: str | None = None,
    now: datetime | None = None,
    storage: MemoryStorage | None = None,
    threshold: float | None = None,
) -> LifecycleReport:
    """Every live fact (of ``user_id``, or of everyone) whose decay score is under the threshold.

    ``threshold`` defaults to the configured ``expire_below``; with neither, there is nothing to do.
    """
    config = get_memory_config()
    below = threshold if threshold is not None else config.expire_below
    if below is None:
        raise ConfigError("expire_below is not set: nothing expires (set it, or pass --below)")
    policy = RetentionPolicy.of(config.model_copy(update={"expire_below": below}))
    evaluated_at = now or datetime.now(UTC)
    operations = operations_of(storage)
    scopes = operations.list_scopes(validate_user_id(user_id))
    expiring: list[ExpiringFact] = []
    for scope_user, scope_agent in scopes:
        where = FactFilter(user_id=scope_user, agent_name=scope_agent)
        if scope_user is None:  # the legacy global scope: FactFilter cannot single it out
            continue
        records = operations.query_facts(where, search=None, limit=MAX_PAGE_SIZE, offset=0).facts
        candidates = [record.candidate() for record in records]
        for index, decay in policy.expiring(candidates, evaluated_at).items():
            record = records[index]
            expiring.append(
                ExpiringFact(scope_user, scope_agent, record.fact_id, record.category, record.content, decay)
            )
    return LifecycleReport(below, evaluated_at, len(scopes), expiring)


def run_lifecycle(
    *,
    dry_run: bool,
    user_id: str | None = None,
    now: datetime | None = None,
    storage: MemoryStorage | None = None,
    threshold: float | None = None,
) -> LifecycleReport:
    """``find_expiring``, then (unless ``dry_run``) remove exactly those facts, audited as ``lifecycle``."""
    store = storage if storage is not None else get_memory_storage()
    report = find_expiring(user_id=user_id, now=now, storage=store, threshold=threshold)
    if dry_run or not report.expiring:
        return replace(report, dry_run=dry_run)
    by_scope: dict[tuple[str | None, str | None], list[ExpiringFact]] = {}
    for fact in report.expiring:
        by_scope.setdefault((fact.user_id, fact.agent_name), []).append(fact)
    removed = 0
    for (scope_user, scope_agent), facts in by_scope.items():
        removed += _remove(store, scope_user, scope_agent, facts)
    logger.info("lifecycle run removed %d expired fact(s) below %s", removed, report.threshold)
    return replace(report, removed=removed, dry_run=False)


def _remove(
    storage: MemoryStorage, user_id: str | None, agent_name: str | None, facts: list[ExpiringFact]
) -> int:
    details = {fact.fact_id: fact.decay.detail("expired") for fact in facts}
    document = storage.reload(agent_name, user_id=user_id)
    stored = document.get("facts") or []
    kept = [fact for fact in stored if not (isinstance(fact, dict) and fact.get("id") in details)]
    if len(kept) == len(stored):
        return 0
    document["facts"] = kept
    if isinstance(storage, SqlMemoryStorage):
        saved = storage.save(document, agent_name, user_id=user_id, origin=LIFECYCLE_ORIGIN, removals=details)
    else:
        saved = storage.save(document, agent_name, user_id=user_id, origin=LIFECYCLE_ORIGIN)
    if not saved:
        raise StorageWriteError(f"the store refused the lifecycle save of scope {(user_id, agent_name)}")
    return len(stored) - len(kept)
