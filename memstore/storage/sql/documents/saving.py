"""The save transaction of the SQL provider, mixed into ``SqlMemoryStorage`` (``provider.py``).

One transaction that takes the scope's write lock first (``BEGIN IMMEDIATE`` on SQLite,
``SELECT ... FOR UPDATE`` on PostgreSQL), merges the document into the stored rows
(``merge.py``), writes only the rows that changed plus the audit rows derived from them
(``history.py``), bumps the scope's revision and stores the document it leaves as the scope's
snapshot (``stored.py``). ``write.py`` holds the transaction's steps. A connection lost before
the ``COMMIT`` is tried once more (``retry.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine

from memstore.errors import FoldTargetGoneError, StaleDocumentError
from memstore.metrics import FACTS_EVICTED
from memstore.retention import RetentionPolicy
from memstore.scope import Identity, Scope, scope_label
from memstore.storage.sql.documents import access
from memstore.storage.sql.documents.cache import CacheEntry, entry_after
from memstore.storage.sql.documents.codec import IncomingDocument
from memstore.storage.sql.documents.inherit import inherit_signals, inherited_signals
from memstore.storage.sql.documents.links import with_known_targets
from memstore.storage.sql.documents.merge import Cap
from memstore.storage.sql.documents.retry import Attempt, save_twice
from memstore.storage.sql.documents.statements import (
    MARK_CLEARED,
    RUN_UPDATE_SCOPE,
    RUN_WRITE_TIMEOUTS,
    lock_scope,
    scope_keys,
)
from memstore.storage.sql.documents.stored import write_snapshot
from memstore.storage.sql.documents.tenant_cap import refuse_over_cap
from memstore.storage.sql.documents.write import (
    apply_plan,
    audit_folds,
    complete_leased,
    confirm_facts,
    late_write,
    plan_save,
    refuse_unauthorised_sharing,
    vanished_fold_targets,
)
from memstore.storage.sql.driver import DriverStatement
from memstore.storage.sql.identity import TIMEOUTS_AND_IDENTITY, identity_parameters, policies_apply
from memstore.storage.sql.maintenance import erase as maintenance
from memstore.storage.sql.queue.table import QueueLease
from memstore.storage.sql.replica import ReadRouter

logger = logging.getLogger(__name__)

_TIMEOUTS_AND_IDENTITY = DriverStatement(TIMEOUTS_AND_IDENTITY)

TenantScope = tuple[str, str | None, str | None]
"""``(tenant_id, user_id, agent_name)``: what the cache keys on, so tenants never share an entry."""


class SqlSaves:
    """The attributes and helpers below are the provider's."""

    _identity: Identity
    _write_options: dict[str, Any]
    _pg_timeouts: dict[str, str]
    _insert_scope: Any
    _max_facts: int
    _retention: RetentionPolicy
    _tenant_max_facts: int | None
    _routes: ReadRouter

    @property
    def _engine(self) -> Engine:
        raise NotImplementedError

    def _key(self, scope: Scope) -> TenantScope:
        raise NotImplementedError

    def _acting(self, user_id: str | None) -> Identity:
        raise NotImplementedError

    def _write(
        self,
        scope: Scope,
        incoming: IncomingDocument,
        origin: str,
        **options: Any,
    ) -> CacheEntry | None:
        """Run the save transaction (``_write_once``), once more if its connection was lost before
        its ``COMMIT`` (``retry.py``); returns what to cache, or None when there is nothing to cache."""
        return save_twice(lambda attempt: self._write_once(attempt, scope, incoming, origin, **options))

    def _write_once(
        self,
        attempt: Attempt,
        scope: Scope,
        incoming: IncomingDocument,
        origin: str,
        *,
        captured_at: datetime | None = None,
        clear: bool = False,
        cached: CacheEntry | None = None,
        lease: QueueLease | None = None,
        removals: Mapping[str, Mapping[str, Any]] | None = None,
        confirmed: list[str] | None = None,
        folded: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    ) -> CacheEntry | None:
        """One try of the save transaction; returns what to cache, or None when there is nothing to cache.

        ``cached`` is the cache entry ``incoming`` was parsed against, for the fast path. Each save
        that changes the scope writes the document it leaves as the scope's snapshot
        (``stored.write_snapshot``), in its transaction, unless the rows differ from its plan.
        """
        tenant_id = self._identity.tenant_id
        keys = scope_keys(scope, tenant_id)
        now = datetime.now(UTC)
        with self._engine.connect() as conn:
            conn.execution_options(**self._write_options)
            with conn.begin() as transaction, attempt.commits():
                if conn.dialect.name == "postgresql" and policies_apply(self._engine, conn):
                    settings = {**self._pg_timeouts, **identity_parameters(self._acting(scope[0]))}
                    _TIMEOUTS_AND_IDENTITY.run(conn, settings)
                elif conn.dialect.name == "postgresql":
                    RUN_WRITE_TIMEOUTS.run(conn, self._pg_timeouts)
                scope_row = lock_scope(conn, keys)
                created = scope_row is None
                if scope_row is None:
                    # No row to lock yet: serialise with an erase of this user, which could not see
                    # the scope this transaction is about to create (PostgreSQL; SQLite has one writer).
                    maintenance.lock_user(conn, scope[0], tenant_id)
                    conn.execute(
                        self._insert_scope,
                        {"tenant_id": tenant_id, "user_id": scope[0], "agent_name": scope[1], "now": now},
                    )
                    scope_row = lock_scope(conn, keys)
                    assert scope_row is not None, "the scope was just created in this transaction"
                refusal = late_write(
                    conn, tenant_id, scope, scope_row, incoming, captured_at, created=created
                )
                if refusal is not None:
                    transaction.rollback()
                    logger.warning("memory update (%s) dropped: %s", scope_label(scope), refusal)
                    raise StaleDocumentError(f"memory not saved: {refusal}")
                if clear:
                    conn.execute(MARK_CLEARED, {"b_id": scope_row.scope_id, "b_now": now})
                if confirmed and not created:  # first, so the cap ranks them as confirmed
                    confirm_facts(conn, scope_row.scope_id, confirmed, now)
                inherited = (
                    inherited_signals(conn, tenant_id, scope, removals) if removals and not created else {}
                )
                cap = Cap(self._max_facts, self._retention, now, inherited)
                incoming = with_known_targets(conn, None if created else scope_row.scope_id, incoming)
                plan = plan_save(
                    conn,
                    scope_row,
                    incoming,
                    cached,
                    cap,
                    lambda: access.fact_signals(conn, tenant_id, scope),
                )
                refuse_unauthorised_sharing(plan, self._identity.roles)
                refuse_over_cap(conn, self._engine, tenant_id, plan, self._tenant_max_facts)
                for fact_id in plan.tombstones:
                    if fact_id not in plan.removal_detail and removals and fact_id in removals:
                        plan.removal_detail[fact_id] = dict(removals[fact_id])
                if not plan.changed and clear:
                    return None
                gone = vanished_fold_targets(plan, folded)
                if gone:
                    transaction.rollback()
                    raise FoldTargetGoneError(f"facts {sorted(gone)} were deleted by another writer")
                if not plan.changed:
                    if folded:  # into facts this save leaves as they are
                        audit_folds(conn, scope_row.scope_id, scope_row.revision, now, origin, folded)
                    if lease is not None and not created:
                        # Nothing to save, but the conversation is done: settle it right here.
                        complete_leased(transaction, conn, lease, now)
                    elif not confirmed or created:
                        transaction.rollback()
                    if created:
                        return None
                    return entry_after(
                        scope_row,
                        scope_row.version,
                        scope_row.scope_updated_at,
                        scope_row.revision,
                        plan,
                        cached,
                    )
                if lease is not None:
                    complete_leased(transaction, conn, lease, now)
                exact = apply_plan(conn, tenant_id, scope_row.scope_id, plan, now, origin)
                if folded:  # after the plan: a fold into a fact this save inserts follows its insert
                    audit_folds(conn, scope_row.scope_id, plan.revision, now, origin, folded)
                inherit_signals(conn, scope_row.scope_id, inherited)
                RUN_UPDATE_SCOPE.run(
                    conn,
                    {
                        "b_id": scope_row.scope_id,
                        "b_revision": plan.revision,
                        "b_version": plan.version or scope_row.version,
                        "b_now": now,
                    },
                )
                version = plan.version or scope_row.version
                entry = entry_after(scope_row, version, now, plan.revision, plan, cached)
                if exact:  # else the rows differ from the plan: the next load reads what was stored
                    write_snapshot(conn, scope_row.scope_id, entry)
        FACTS_EVICTED.inc(plan.evictions)  # committed
        self._routes.wrote(self._key(scope), scope_row.scope_id, plan.revision)
        return entry if exact else None
