"""Expiry: remove the facts whose decay score fell under ``expire_below`` (``memstore lifecycle run``).

A run goes scope by scope (every scope, or one user's): it reads the scope and its signals,
scores each live fact at one instant (``memstore.retention``: decay is ``confidence * max(freshness,
heat)``, freshness over a half-life stretched by the fact's ``importance``; protected categories
never expire) and removes those under the threshold right away.
Its report also counts what the other retention rules would do with the current settings (the
protected facts, the excess over ``max_facts``), so a dry run answers even with expiry off.
Each removal is an ordinary merge-safe save of the scope as just read, with origin ``lifecycle``
and the fact's decay score and importance in the audit ``detail``: a save racing the run keeps
its own changes, a stale document cannot bring an expired fact back (its tombstone is newer than
what that document loaded), and a save that only removes facts never evicts others. A dry run
only scores.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from memstore.config import get_memory_config
from memstore.document import MemoryDocument, format_timestamp, without_ids
from memstore.errors import ConfigError, StorageWriteError
from memstore.ops.queries import operations_of
from memstore.record import DEFAULT_IMPORTANCE
from memstore.retention import RetentionPolicy, Score, candidate_of
from memstore.scope import DEFAULT_TENANT_ID, validate_tenant_id, validate_user_id
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage, load_storage_class
from memstore.storage.sessions.loader import get_session_store
from memstore.storage.sql import SqlMemoryStorage

logger = logging.getLogger(__name__)

LIFECYCLE_ORIGIN = "lifecycle"


@dataclass(frozen=True)
class ExpiringFact:
    tenant_id: str
    user_id: str | None
    agent_name: str | None
    fact_id: str
    category: str
    content: str
    decay: Score
    importance: float = DEFAULT_IMPORTANCE

    def detail(self) -> dict[str, Any]:
        """The audit ``detail`` of its removal: the decay score, its parts and the importance."""
        return self.decay.detail("expired", importance=self.importance)

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "user_id": self.user_id,
            "agent_name": self.agent_name,
            "fact_id": self.fact_id,
            "category": self.category,
            "content": self.content,
            **self.detail(),
        }


@dataclass(frozen=True)
class LifecycleReport:
    """What each retention rule found with the current settings, and what the run removed.

    Expiry lists the facts under ``threshold`` (``None``: expiry is off) and how many of them were
    removed (0 on a dry run); ``protected`` counts live facts of the categories that never expire;
    ``over_cap`` the facts past ``max_facts`` that the next save adding facts evicts (scopes over
    the cap, after this run's expiry). ``scopes_scanned`` counts every scope read, the legacy
    ones without a user included.
    """

    threshold: float | None
    evaluated_at: datetime
    scopes_scanned: int
    live_facts: int = 0
    expiring: list[ExpiringFact] = field(default_factory=list)
    removed: int = 0
    dry_run: bool = True
    protected_categories: tuple[str, ...] = ()
    protected: int = 0
    max_facts: int = 0
    scopes_over_cap: int = 0
    over_cap: int = 0
    sessions_expired: int = 0
    """Sessions past ``session_ttl_seconds`` deleted: by a real run over every user and tenant only
    (reads skip expired sessions whenever they are deleted)."""

    @property
    def expiring_scopes(self) -> int:
        return len({(fact.user_id, fact.agent_name) for fact in self.expiring})

    def lowest(self, limit: int | None = None) -> list[ExpiringFact]:
        """The expiring facts, lowest decay first (the surest to go), at most ``limit`` of them."""
        ranked = sorted(self.expiring, key=lambda fact: fact.decay.value)
        return ranked if limit is None else ranked[:limit]

    def to_json(self, limit: int | None = None) -> dict[str, Any]:
        """The summary, and the expiring facts (lowest decay first; every one unless ``limit``)."""
        return {
            "threshold": self.threshold,
            "evaluated_at": self.evaluated_at.isoformat(),
            "scopes_scanned": self.scopes_scanned,
            "live_facts": self.live_facts,
            "dry_run": self.dry_run,
            "expiring_count": len(self.expiring),
            "expiring_scopes": self.expiring_scopes,
            "removed": self.removed,
            "protected": {"categories": list(self.protected_categories), "facts": self.protected},
            "cap": {
                "max_facts": self.max_facts,
                "scopes_over": self.scopes_over_cap,
                "facts_over": self.over_cap,
            },
            "sessions_expired": self.sessions_expired,
            "expiring": [fact.to_json() for fact in self.lowest(limit)],
        }


def with_retention(
    facts: list[dict[str, Any]],
    *,
    agent_name: str | None = None,
    user_id: str | None = None,
    storage: MemoryStorage | None = None,
) -> list[dict[str, Any]]:
    """Copies of a scope's ``facts``, each with a read-only ``retention`` object, for display.

    It holds the retention signals, the eviction score and the decay score now. The file provider keeps no
    signals: its facts show no accesses and a score from confidence and age alone.
    """
    store = storage if storage is not None else get_memory_storage()
    signals = store.fact_signals(agent_name, user_id=user_id)
    policy, now = RetentionPolicy.of(get_memory_config()), datetime.now(UTC)
    shown = []
    for index, fact in enumerate(facts):
        candidate = candidate_of(fact, signals, index)
        signal = candidate.signals
        score = policy.score(candidate, now)
        retention = {
            "lastConfirmedAt": _iso(signal.last_confirmed_at),
            "lastAccessedAt": _iso(signal.last_accessed_at),
            "accessCount": signal.access_count,
            "score": round(score.value, 6),
            "decay": round(policy.decay(candidate, now).value, 6),
        }
        shown.append({**fact, "retention": retention})
    return shown


def _iso(value: datetime | None) -> str | None:
    return None if value is None else format_timestamp(value)


def run_lifecycle(
    *,
    dry_run: bool,
    user_id: str | None = None,
    now: datetime | None = None,
    storage: MemoryStorage | None = None,
    threshold: float | None = None,
    tenant_id: str | None = None,
) -> LifecycleReport:
    """Score every live fact (of ``user_id``, or of every scope; of ``tenant_id``, or of every
    tenant) and, unless ``dry_run``, remove those under the threshold, scope by scope, right after
    scoring it.

    ``threshold`` defaults to the configured ``expire_below``. With neither, expiry is off: a dry
    run reports the other rules (nothing to expire is a result), a real run is refused. Each
    scope is read afresh with its signals, so a fact edited or used before its scope's turn is
    scored as it is then.
    """
    config = get_memory_config()
    below = threshold if threshold is not None else config.expire_below
    if below is None and not dry_run:
        raise ConfigError("expire_below is not set: nothing expires (set it, or pass --below)")
    policy = RetentionPolicy.of(config.model_copy(update={"expire_below": below}))
    evaluated_at = now or datetime.now(UTC)
    store = storage if storage is not None else _operator_storage()
    user = validate_user_id(user_id)
    tenants = [validate_tenant_id(tenant_id)] if tenant_id is not None else _tenants(store)
    scopes = [
        (handle, scope)
        for handle in (store.for_identity(tenant) for tenant in tenants)
        for scope in operations_of(handle).list_scopes(user)
    ]
    expiring: list[ExpiringFact] = []
    removed = live = protected = scopes_over = over_cap = 0
    for handle, (scope_user, scope_agent) in scopes:
        document = handle.reload(scope_agent, user_id=scope_user)
        facts = [fact for fact in document.get("facts") or () if isinstance(fact, dict)]
        signals = handle.fact_signals(scope_agent, user_id=scope_user)
        candidates = [candidate_of(fact, signals, index) for index, fact in enumerate(facts)]
        found = {
            index: decay
            for index, decay in policy.expiring(candidates, evaluated_at).items()
            if isinstance(facts[index].get("id"), str)  # an id-less fact cannot be named in a removal
        }
        live += len(facts)
        protected += sum(1 for candidate in candidates if candidate.category in policy.protected_categories)
        excess = len(facts) - len(found) - config.max_facts
        if excess > 0:
            scopes_over += 1
            over_cap += excess
        scope_expiring = [
            ExpiringFact(
                handle.identity.tenant_id,
                scope_user,
                scope_agent,
                candidates[index].fact_id,
                candidates[index].category,
                str(facts[index].get("content", "")),
                decay,
                candidates[index].importance,
            )
            for index, decay in found.items()
        ]
        expiring.extend(scope_expiring)
        if scope_expiring and not dry_run:
            removed += _remove(handle, document, scope_user, scope_agent, scope_expiring)
    sessions_expired = 0
    if not dry_run:
        logger.info("lifecycle run removed %d expired fact(s) below %s", removed, below)
        if user is None and tenant_id is None:  # a run over everyone: expired sessions go too
            sessions_expired = get_session_store(config).expire(evaluated_at)
    return LifecycleReport(
        threshold=below,
        evaluated_at=evaluated_at,
        scopes_scanned=len(scopes),
        live_facts=live,
        expiring=expiring,
        removed=removed,
        dry_run=dry_run,
        protected_categories=tuple(sorted(policy.protected_categories)),
        protected=protected,
        max_facts=config.max_facts,
        scopes_over_cap=scopes_over,
        over_cap=over_cap,
        sessions_expired=sessions_expired,
    )


def _tenants(store: MemoryStorage) -> list[str]:
    """Every tenant of a provider that has tenants; the default one of any other."""
    listed = getattr(store, "tenants", None)
    return list(listed()) if callable(listed) else [DEFAULT_TENANT_ID]


def _operator_storage() -> MemoryStorage:
    """The configured store, on ``operator_database_url`` when set: a run crosses every scope,
    which the application's role under PostgreSQL's row-level security does not see."""
    config = get_memory_config()
    if config.operator_database_url and issubclass(
        load_storage_class(config.storage_class), SqlMemoryStorage
    ):
        return SqlMemoryStorage(config.operator_database_url)
    return get_memory_storage()


def _remove(
    storage: MemoryStorage,
    document: MemoryDocument,
    user_id: str | None,
    agent_name: str | None,
    facts: list[ExpiringFact],
) -> int:
    """Save ``document`` without ``facts``: a merge-safe save, so a concurrent writer loses nothing."""
    details = {fact.fact_id: fact.detail() for fact in facts}
    stored = document.get("facts") or []
    document["facts"] = without_ids(stored, details.keys())
    saved = storage.save(document, agent_name, user_id=user_id, origin=LIFECYCLE_ORIGIN, removals=details)
    if not saved:
        raise StorageWriteError(f"the store refused the lifecycle save of scope {(user_id, agent_name)}")
    return len(stored) - len(document["facts"])
