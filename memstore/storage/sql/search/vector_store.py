"""``SqlVectorStore``: the SQL provider's ``VectorStore``, with a bounded per-process vector cache.

Query-aware injection ranks a scope's facts on every request, so the scope's vectors are cached
by fact id together with the content key they were made from. A fact whose content key differs
from the cached one (edited), or that the cache lacks (new, or embedded by another process), is
read again; the cache is only ever a subset of the table, so it needs no invalidation. It holds at
most ``MAX_CACHED_VECTORS`` vectors, dropping the least recently used scopes first.

A scope's vectors and the nearest-neighbour search are read where the provider's ``ReadRouter``
sends them (a read replica with ``database_read_url``, once it holds the vectors this process
stored); the facts still to embed, which a write follows, and the status are read on the primary.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from memstore.document import fact_content_key
from memstore.errors import StorageUnavailableError
from memstore.scope import DEFAULT_IDENTITY, Identity, Scope
from memstore.storage.records import FactFilter, FactPage, owners_words_kept
from memstore.storage.sql.engine import engine_for
from memstore.storage.sql.identity import set_identity
from memstore.storage.sql.replica import Connect, ReadRouter
from memstore.storage.sql.search import embeddings
from memstore.storage.sql.search.semantic import nearest_facts, vector_backend
from memstore.storage.vectors import EmbeddingStatus, UnembeddedFact

if TYPE_CHECKING:
    import numpy as np

MAX_CACHED_VECTORS = 20_000
"""About 30 MB of 384-dimension vectors."""

_ScopeVectors = dict[str, tuple[str, "np.ndarray"]]


class SqlVectorStore:
    def __init__(
        self,
        routes: ReadRouter,
        *,
        write_options: dict[str, Any],
        unavailable: Callable[[Exception, str], StorageUnavailableError],
    ) -> None:
        self._routes = routes
        self._sync_engine = routes.engine
        self._write_options = write_options
        self._unavailable = unavailable
        self._identity = DEFAULT_IDENTITY
        # Keyed by tenant too, and shared by every identity's handle (``for_identity``).
        self._cache: OrderedDict[tuple[str, Scope, str], _ScopeVectors] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()

    @property
    def _engine(self) -> Engine:
        """The engine of the calling face (``engine_for``)."""
        return engine_for(self._sync_engine)

    def for_identity(self, identity: Identity) -> SqlVectorStore:
        """A handle sharing this store's cache that acts inside ``identity``'s tenant."""
        handle = copy.copy(self)
        handle._identity = identity
        return handle

    def _as(self, scope: Scope | None) -> Identity:
        return replace(self._identity, user_id=scope[0] if scope is not None else None)

    def fact_vectors(
        self, scope: Scope, model: str, facts: Sequence[tuple[str, str]]
    ) -> dict[str, np.ndarray]:
        wanted = {fact_id: fact_content_key(content) for fact_id, content in facts}
        with self._lock:
            cached = dict(self._cache.get((self._identity.tenant_id, scope, model), {}))
        found = {fid: entry[1] for fid, entry in cached.items() if wanted.get(fid) == entry[0]}
        missing = [fact_id for fact_id in wanted if fact_id not in found]
        if missing:

            def vectors(connect: Connect) -> dict[str, tuple[str, np.ndarray]]:
                with connect() as conn:
                    return embeddings.scope_vectors(conn, self._identity.tenant_id, scope, model, missing)

            try:
                read = self._routes.run(self._as(scope), vectors, own=True)
            except DBAPIError as exc:
                raise self._unavailable(exc, "read fact vectors") from exc
            fresh = {fid: entry for fid, entry in read.items() if wanted.get(fid) == entry[0]}
            found.update({fid: entry[1] for fid, entry in fresh.items()})
            self._remember(scope, model, {fid: cached[fid] for fid in found if fid in cached} | fresh)
        elif cached:
            key = (self._identity.tenant_id, scope, model)
            with self._lock:
                if key in self._cache:
                    self._cache.move_to_end(key)
        return found

    def _remember(self, scope: Scope, model: str, vectors: _ScopeVectors) -> None:
        """Cache exactly the scope's current vectors (dropping ones of deleted facts)."""
        key = (self._identity.tenant_id, scope, model)
        with self._lock:
            self._cached -= len(self._cache.pop(key, {}))
            if len(vectors) > MAX_CACHED_VECTORS:
                return
            self._cache[key] = vectors
            self._cached += len(vectors)
            while self._cached > MAX_CACHED_VECTORS:
                _, dropped = self._cache.popitem(last=False)
                self._cached -= len(dropped)

    def forget_user(self, user_id: str) -> None:
        """Drop an erased user's cached vectors: an erasure leaves nothing of theirs in memory either."""
        tenant_id = self._identity.tenant_id
        with self._lock:
            for key in [key for key in self._cache if key[0] == tenant_id and key[1][0] == user_id]:
                self._cached -= len(self._cache.pop(key))

    def store_vectors(self, scope: Scope, model: str, items: Sequence[tuple[str, str, np.ndarray]]) -> int:
        if not items:
            return 0
        try:
            with self._engine.connect() as conn:
                conn.execution_options(**self._write_options)
                with conn.begin():
                    set_identity(conn, replace(self._identity, user_id=scope[0]))
                    stored = embeddings.store_vectors(
                        conn, self._identity.tenant_id, scope, model, items, datetime.now(UTC)
                    )
        except DBAPIError as exc:
            raise self._unavailable(exc, "write fact vectors") from exc
        self._routes.committed(self._identity.tenant_id)  # vectors move no revision (replica.py)
        return stored

    def unembedded_facts(
        self, model: str, *, limit: int, after: int = 0, scope: Scope | None = None, rebuild: bool = False
    ) -> list[UnembeddedFact]:
        try:
            with self._routes.primary(self._as(scope)) as conn:
                if rebuild:
                    return embeddings.all_live_facts(conn, limit=limit, after=after)
                return embeddings.unembedded_facts(
                    conn, model, limit=limit, after=after, scope=scope, tenant_id=self._identity.tenant_id
                )
        except DBAPIError as exc:
            raise self._unavailable(exc, "read facts to embed") from exc

    def nearest_facts(
        self, where: FactFilter, vector: np.ndarray, *, model: str, limit: int, offset: int
    ) -> FactPage:
        try:
            # Not the autocommit reader: the exact scan streams through a server-side cursor.
            identity = replace(self._identity, user_id=where.user_id)
            page = self._routes.run(
                identity,
                lambda connect: nearest_facts(
                    connect, where, self._identity, vector, model=model, limit=limit, offset=offset
                ),
                stream=True,
            )
            return owners_words_kept(page, where.user_id)
        except DBAPIError as exc:
            raise self._unavailable(exc, "search fact vectors") from exc

    def status(self) -> EmbeddingStatus:
        try:
            with engine_for(self._routes.reader).connect() as conn:
                live, vectors = embeddings.vector_counts(conn)
                backend = vector_backend(conn)
        except DBAPIError as exc:
            raise self._unavailable(exc, "read the embedding status") from exc
        return EmbeddingStatus(live, vectors, backend)
