"""The SQL provider's query surface (``memstore.storage.operations``): reads across scopes as its
identity may see them, the shared facts ``memory_context`` merges, and the operator's erase and
vacuum, which cross tenants on the operator connection. The reads go where the provider's
``ReadRouter`` sends them (a read replica when ``database_read_url`` is set, ``replica.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from memstore.errors import StorageUnavailableError
from memstore.retention import RetentionPolicy
from memstore.scope import Identity, Scope, normalize_agent_name, resolve_scope, validate_user_id
from memstore.storage.records import (
    FactFilter,
    FactOrder,
    FactPage,
    FactRelations,
    HistoryEntry,
    MemoryStats,
    owners_words_kept,
    with_scores,
)
from memstore.storage.search_text import SearchMatch
from memstore.storage.sql.engine import engine_for
from memstore.storage.sql.maintenance import erase as maintenance
from memstore.storage.sql.maintenance.operator import operator_engine
from memstore.storage.sql.replica import Connect, ReadRouter
from memstore.storage.sql.search import fulltext, queries
from memstore.storage.sql.search.relations import fact_relations
from memstore.storage.sql.search.vector_store import SqlVectorStore
from memstore.storage.sql.search.visibility import visible_facts

T = TypeVar("T")


class SqlQueries:
    """Mixed into ``SqlMemoryStorage``; the attributes below are the provider's."""

    _identity: Identity
    _sync_engine: Engine
    _retention: RetentionPolicy
    _lock: threading.Lock
    _cache: dict[tuple[str, str | None, str | None], Any]
    vectors: SqlVectorStore
    _routes: ReadRouter

    def _acting(self, user_id: str | None) -> Identity:
        raise NotImplementedError

    def _unavailable(self, exc: Exception, doing: str = "read memory") -> StorageUnavailableError:
        raise NotImplementedError

    def _routed(self, user_id: str | None, read: Callable[[Connect], T], *, own: bool = False) -> T:
        """``read`` as ``user_id``, on the replica when it can serve it (``ReadRouter.run``); ``own``:
        it reads the user's own scopes only, so only their pending writes hold it back."""
        return self._routes.run(self._acting(user_id), read, own=own)

    def visible_facts(
        self, agent_name: str | None = None, *, user_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Live facts of other owners of the agent that this identity, as ``user_id``, may read:
        the tenant's public facts and the shared ones granted to the user or its roles."""
        user = validate_user_id(user_id)
        reader = Identity(self._identity.tenant_id, user, self._identity.roles)

        def read(connect: Connect) -> list[dict[str, Any]]:
            with connect() as conn:
                return visible_facts(conn, reader, normalize_agent_name(agent_name))

        try:
            return self._routed(user, read)
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc

    def query_facts(
        self,
        where: FactFilter,
        *,
        search: str | None,
        limit: int,
        offset: int,
        order: FactOrder = "newest",
        match: SearchMatch = "any",
    ) -> FactPage:
        if search is None:
            page = self._routed(
                where.user_id,
                lambda connect: queries.query_facts(
                    connect,
                    where,
                    limit=limit,
                    offset=offset,
                    order=order,
                    policy=self._retention,
                    identity=self._identity,
                ),
            )
        else:
            found = self._routed(
                where.user_id,
                lambda connect: fulltext.search_facts(
                    connect, search, match, where, self._identity, limit, offset
                ),
            )
            page = replace(found, facts=with_scores(found.facts, self._retention, datetime.now(UTC)))
        return owners_words_kept(page, where.user_id)

    def stats(self) -> MemoryStats:
        """Every tenant's totals: an operator's figure, read on the operator connection."""
        return queries.memory_stats(operator_engine(self._sync_engine, "stats"))

    def tenants(self) -> list[str]:
        """Every tenant that holds a scope: an operator's list, read on the operator connection."""
        return queries.list_tenants(operator_engine(self._sync_engine, "listing tenants"))

    def list_scopes(self, user_id: str | None = None) -> list[Scope]:
        return self._routed(
            user_id, lambda connect: queries.list_scopes(connect, self._identity.tenant_id, user_id), own=True
        )

    def history(self, where: FactFilter, *, fact_id: str | None, limit: int) -> list[HistoryEntry]:
        return self._routed(
            where.user_id,
            lambda connect: queries.fact_history(
                connect, where, self._identity, fact_id=fact_id, limit=limit
            ),
        )

    def fact_relations(
        self, fact_id: str, agent_name: str | None = None, *, user_id: str | None = None
    ) -> FactRelations:
        """The fact's relations both ways, inside its own scope (never another owner's)."""
        scope = resolve_scope(agent_name, user_id)
        try:
            return self._routed(
                scope[0],
                lambda connect: fact_relations(connect, self._identity.tenant_id, scope, fact_id),
                own=True,
            )
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc

    def erase_user(self, user_id: str) -> dict[str, int]:
        """Erase the user's memory in this handle's tenant (the operator connection does it)."""
        tenant_id = self._identity.tenant_id
        erased = self._routes.scope_ids(self._acting(user_id))  # for the replica to drop (replica.py)
        counts = maintenance.erase_user(
            engine_for(self._sync_engine), user_id, datetime.now(UTC), tenant_id=tenant_id
        )
        self._routes.erased(tenant_id, user_id, erased)
        self.vectors.forget_user(user_id)
        with self._lock:
            for key in [key for key in self._cache if key[0] == tenant_id and key[1] == user_id]:
                del self._cache[key]
        return counts

    def vacuum(self, cutoff: datetime) -> dict[str, int]:
        return maintenance.vacuum(engine_for(self._sync_engine), cutoff)
