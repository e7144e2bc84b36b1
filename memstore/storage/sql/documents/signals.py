"""Retention signals of the SQL provider: access counts, flushed signals, and the reasons a host
that evicts facts itself (DeerMem) gives for them. Mixed into ``SqlMemoryStorage``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from memstore.errors import StorageUnavailableError
from memstore.retention import FactSignals
from memstore.scope import Identity, resolve_scope
from memstore.storage.sql.documents import access
from memstore.storage.sql.documents.write import annotate_deletions
from memstore.storage.sql.engine import engine_for
from memstore.storage.sql.identity import transaction


class SqlSignals:
    """The attributes and helpers below are the provider's."""

    _identity: Identity
    _sync_engine: Engine
    _access: access.AccessRecorder | None

    def _reading(self, user_id: str | None) -> AbstractContextManager[Connection]:
        raise NotImplementedError

    def _acting(self, user_id: str | None) -> Identity:
        raise NotImplementedError

    def _unavailable(self, exc: Exception, doing: str = "read memory") -> StorageUnavailableError:
        raise NotImplementedError

    def record_access(self, agent_name: str | None, *, user_id: str | None, fact_ids: Iterable[str]) -> None:
        """Count an access of the facts (in memory; written in batches by ``access.AccessRecorder``)."""
        if self._access is not None:
            self._access.record(self._identity.tenant_id, resolve_scope(agent_name, user_id), fact_ids)

    def flush_access(self, *, due_only: bool = False) -> int:
        """Write the pending access counts now; how many facts were written (see ``access.py``)."""
        return 0 if self._access is None else self._access.flush(due_only=due_only)

    def fact_signals(
        self, agent_name: str | None = None, *, user_id: str | None = None
    ) -> dict[str, FactSignals]:
        """Retention signals of the scope's live facts by id, as flushed (one SELECT)."""
        scope = resolve_scope(agent_name, user_id)
        try:
            with self._reading(scope[0]) as conn:
                return access.fact_signals(conn, self._identity.tenant_id, scope)
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc

    def annotate_removals(
        self, agent_name: str | None, *, user_id: str | None, details: Mapping[str, Mapping[str, Any]]
    ) -> None:
        """Record why facts went on their latest deletion rows, for a host that evicts itself (DeerMem).

        Only rows without a ``detail`` are annotated, so a reason memstore recorded is never replaced.
        """
        if not details:
            return
        scope = resolve_scope(agent_name, user_id)
        try:
            with transaction(engine_for(self._sync_engine), self._acting(scope[0])) as conn:
                annotate_deletions(conn, self._identity.tenant_id, scope, details)
        except DBAPIError as exc:
            raise self._unavailable(exc, "annotate the audit trail") from exc
