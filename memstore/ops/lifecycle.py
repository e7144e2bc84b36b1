"""Expiry: remove the facts whose decay score fell under ``expire_below`` (``memstore lifecycle run``).

A run scores every live fact (of every scope, or one user's) at one instant
(``memstore.retention``: decay is ``confidence * max(freshness, heat)``, freshness over a
half-life stretched by the fact's ``importance``; protected categories never expire). On the SQL
provider it reads the facts and their signals straight from the table, ``BATCH_FACTS`` at a time
(``storage.sql.maintenance.lifecycle``: 100,000 facts read and scored in about a second of CPU,
where reloading each scope's document took four); any other provider's scopes are read as
documents.
Its report also counts what the other retention rules would do with the current settings (the
protected facts, the excess over ``max_facts``), so a dry run answers even with expiry off.
A real run removes a scope's expiring facts right after reading the scope afresh and scoring it
again (a fact confirmed, used or edited since the scan is judged as it is now), at most
``BATCH_FACTS`` per save. Each removal is an ordinary merge-safe save of the scope as just read,
in its own transaction, with origin ``lifecycle`` and the fact's decay score and importance in
the audit ``detail``: a save racing the run keeps its own changes and waits for one batch at
most, a stale document cannot bring an expired fact back (its tombstone is newer than what that
document loaded), and a save that only removes facts never evicts others. A dry run only scores.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from memstore.config import get_memory_config
from memstore.document import MemoryDocument, format_timestamp, without_ids
from memstore.errors import ConfigError, MemstoreError, StorageWriteError
from memstore.record import DEFAULT_IMPORTANCE
from memstore.retention import RetentionPolicy, ScopeFacts, Score, candidate_of
from memstore.scope import DEFAULT_TENANT_ID, validate_tenant_id, validate_user_id
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage, load_storage_class
from memstore.storage.operations import StorageOperations
from memstore.storage.sessions.loader import get_session_store
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.maintenance.lifecycle import LiveFactScan

logger = logging.getLogger(__name__)

LIFECYCLE_ORIGIN = "lifecycle"


@dataclass(frozen=True, slots=True)
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


BATCH_FACTS = 1_000
"""Facts per read of a run, and at most per removal: each removal is its own short transaction
(a merge-safe save), so a concurrent writer waits for one batch at most, never for the run."""

Progress = Callable[[int, int], None]
"""Called as ``progress(facts scored so far, facts in the run)``: first with ``0``, then after each
batch, and in a real run after each scope's removal too (outside any transaction)."""


def run_lifecycle(
    *,
    dry_run: bool,
    user_id: str | None = None,
    now: datetime | None = None,
    storage: MemoryStorage | None = None,
    threshold: float | None = None,
    tenant_id: str | None = None,
    progress: Progress | None = None,
    batch_facts: int = BATCH_FACTS,
) -> LifecycleReport:
    """Score every live fact (of ``user_id``, or of every scope; of ``tenant_id``, or of every
    tenant) and, unless ``dry_run``, remove those under the threshold, batch by batch.

    ``threshold`` defaults to the configured ``expire_below``. With neither, expiry is off: a dry
    run reports the other rules (nothing to expire is a result), a real run is refused. The SQL
    provider's facts are read ``batch_facts`` at a time straight from the table
    (``storage.sql.maintenance.lifecycle``); any other provider's scope by scope. A real run
    removes a scope's facts only after reading it afresh and scoring it again, at most
    ``batch_facts`` per save, so a fact edited, confirmed or used since the scan is judged as it
    is then, and a save racing the run keeps its changes.
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
    scans = [(handle, _scan(handle, user, batch_facts)) for handle in map(store.for_identity, tenants)]
    total, done = sum(scan.total for _, scan in scans), 0
    if progress is not None:
        progress(0, total)
    tally = _Tally(policy, evaluated_at, config.max_facts)
    for handle, scan in scans:
        tally.scopes += scan.scopes
        for batch in scan:
            for scope in batch:
                found = tally.count(handle.identity.tenant_id, scope)
                done += len(scope.candidates)
                if found and not dry_run:
                    removed, found = _expire(handle, scope, policy, evaluated_at, batch_facts)
                    tally.removed += removed
                    if progress is not None:  # after each removal too: each takes a transaction
                        progress(done, total)
                tally.expiring.extend(found)
            if progress is not None:
                progress(done, total)
    sessions_expired = 0
    if not dry_run:
        logger.info("lifecycle run removed %d expired fact(s) below %s", tally.removed, below)
        if user is None and tenant_id is None:  # a run over everyone: expired sessions go too
            sessions_expired = get_session_store(config).expire(evaluated_at)
    return LifecycleReport(
        threshold=below,
        evaluated_at=evaluated_at,
        scopes_scanned=tally.scopes,
        live_facts=tally.live,
        expiring=tally.expiring,
        removed=tally.removed,
        dry_run=dry_run,
        protected_categories=tuple(sorted(policy.protected_categories)),
        protected=tally.protected,
        max_facts=config.max_facts,
        scopes_over_cap=tally.scopes_over,
        over_cap=tally.over_cap,
        sessions_expired=sessions_expired,
    )


@dataclass
class _Tally:
    """The report's counts, scope by scope."""

    policy: RetentionPolicy
    now: datetime
    max_facts: int
    scopes: int = 0
    live: int = 0
    protected: int = 0
    scopes_over: int = 0
    over_cap: int = 0
    removed: int = 0
    expiring: list[ExpiringFact] = field(default_factory=list)

    def count(self, tenant_id: str, scope: ScopeFacts) -> list[ExpiringFact]:
        """Count ``scope``'s live, protected and excess facts; its facts under the threshold."""
        found = _expiring(tenant_id, scope, self.policy, self.now)
        protected = self.policy.protected_categories
        self.live += len(scope.candidates)
        self.protected += sum(1 for candidate in scope.candidates if candidate.category in protected)
        excess = len(scope.candidates) - len(found) - self.max_facts
        if excess > 0:
            self.scopes_over += 1
            self.over_cap += excess
        return found


def _expiring(
    tenant_id: str, scope: ScopeFacts, policy: RetentionPolicy, now: datetime
) -> list[ExpiringFact]:
    """``scope``'s facts under the threshold, in document order (an id-less one cannot be removed)."""
    candidates = scope.candidates
    return [
        ExpiringFact(
            tenant_id,
            scope.user_id,
            scope.agent_name,
            candidates[index].fact_id,
            candidates[index].category,
            scope.contents[index],
            decay,
            candidates[index].importance,
        )
        for index, decay in policy.expiring(candidates, now).items()
        if index not in scope.unnamed
    ]


class _Scan(Protocol):
    """Where a run's facts come from: ``scopes`` and ``total`` (facts) known before the first batch."""

    @property
    def scopes(self) -> int: ...

    @property
    def total(self) -> int: ...

    def __iter__(self) -> Iterator[list[ScopeFacts]]: ...


def _scan(handle: MemoryStorage, user_id: str | None, batch_facts: int) -> _Scan:
    if isinstance(handle, SqlMemoryStorage):
        return LiveFactScan(handle.engine, handle.identity, user_id, batch_facts=batch_facts)
    return _DocumentScan(handle, user_id)


class _DocumentScan:
    """Any other provider's scopes (the file provider's), each read as a document up front."""

    def __init__(self, handle: MemoryStorage, user_id: str | None) -> None:
        if not isinstance(handle, StorageOperations):
            raise MemstoreError(f"{type(handle).__name__} does not support the lifecycle run")
        self._read = [read_scope(handle, user, agent)[1] for user, agent in handle.list_scopes(user_id)]
        self.scopes = len(self._read)
        self.total = sum(len(scope.candidates) for scope in self._read)

    def __iter__(self) -> Iterator[list[ScopeFacts]]:
        return ([scope] for scope in self._read)


def read_scope(
    handle: MemoryStorage, user_id: str | None, agent_name: str | None
) -> tuple[MemoryDocument, ScopeFacts]:
    """The scope's document, read afresh, and its facts with their signals as the rules see them."""
    document = handle.reload(agent_name, user_id=user_id)
    facts = [fact for fact in document.get("facts") or () if isinstance(fact, dict)]
    signals = handle.fact_signals(agent_name, user_id=user_id)
    return document, ScopeFacts(
        user_id,
        agent_name,
        [candidate_of(fact, signals, index) for index, fact in enumerate(facts)],
        [str(fact.get("content", "")) for fact in facts],
        frozenset(index for index, fact in enumerate(facts) if not isinstance(fact.get("id"), str)),
    )


def _expire(
    handle: MemoryStorage, scope: ScopeFacts, policy: RetentionPolicy, now: datetime, batch_facts: int
) -> tuple[int, list[ExpiringFact]]:
    """Remove ``scope``'s expiring facts, at most ``batch_facts`` per save; each save follows a
    fresh read and a fresh score (the re-check), so what changed since the scan decides.

    Returns how many facts went and the facts judged expiring on those reads.
    """
    removed, expired = 0, []
    while True:
        document, fresh = read_scope(handle, scope.user_id, scope.agent_name)
        found = _expiring(handle.identity.tenant_id, fresh, policy, now)
        batch = found[:batch_facts]
        gone = _remove(handle, document, scope.user_id, scope.agent_name, batch) if batch else 0
        removed += gone
        expired += batch
        if not gone or len(found) <= batch_facts:
            return removed, expired


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
