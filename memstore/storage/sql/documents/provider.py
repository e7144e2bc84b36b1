"""``SqlMemoryStorage``: the memory document kept in normalised SQL tables (SQLite or PostgreSQL).

Loads: one cheap revision query validates the per-instance cache; a miss reads the scope in one
statement (``load.py``: one snapshot, one round trip), from the scope's derived snapshot row
when a save wrote it at the scope's revision, else from its sections and live facts.

Saves (``saving.py``): one transaction under the scope's write lock that merges the document into
the stored rows, writes only what changed with its audit rows, bumps the scope's revision and
stores the document it leaves as the scope's snapshot. A save that changes nothing writes nothing
and keeps the revision. Waiting for that lock is bounded by ``write_lock_timeout_seconds``
(SQLite's busy timeout, PostgreSQL's ``lock_timeout``, with ``write_statement_timeout_seconds`` as
its ``statement_timeout``); running out is an outage. A PostgreSQL connection found gone costs a
read, or a save not yet committing, one more try (``retry.py``), not an error.

The cache (``cache.py``) keeps, next to each document, a ``Snapshot`` of its rows. A save of a
document loaded at the revision the store is still at (the usual case: no concurrent writer) is
parsed and planned against the snapshot (``snapshot.py``), without re-encoding unchanged facts or
reading the rows, so its cost follows the size of the change; anything else takes the full merge
over the stored rows.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from memstore.config import get_memory_config
from memstore.document import MemoryDocument, create_empty_memory, unstored_memory
from memstore.errors import MalformedDocumentError, StorageUnavailableError
from memstore.metrics import timed_storage
from memstore.retention import RetentionPolicy
from memstore.scope import DEFAULT_IDENTITY, Identity, Scope, resolve_scope, scope_label
from memstore.storage.base import MemoryStorage
from memstore.storage.sql.documents import access
from memstore.storage.sql.documents.cache import CacheEntry, stamp
from memstore.storage.sql.documents.codec import parse_document
from memstore.storage.sql.documents.load import read_entry
from memstore.storage.sql.documents.retry import read_twice
from memstore.storage.sql.documents.saving import SqlSaves, TenantScope
from memstore.storage.sql.documents.signals import SqlSignals
from memstore.storage.sql.documents.statements import INSERT_SCOPE, STAMP_QUERY, scope_keys
from memstore.storage.sql.engine import (
    SQLITE_BUSY_TIMEOUT_OPTION,
    SQLITE_WRITE_OPTION,
    database_url_from_config,
    describe_db_error,
    engine_for,
    get_engine,
    is_outage,
    mask_url,
)
from memstore.storage.sql.queue.table import QueueLease
from memstore.storage.sql.replica import Connect, ReadRouter
from memstore.storage.sql.schema.migrate import prepare_once
from memstore.storage.sql.search.operations import SqlQueries
from memstore.storage.sql.search.vector_store import SqlVectorStore

logger = logging.getLogger(__name__)

DEFAULT_ORIGIN = "unknown"
CLEAR_ORIGIN = "erase"
MAX_ORIGIN = 255


class SqlMemoryStorage(SqlSaves, SqlSignals, SqlQueries, MemoryStorage):
    """Memory documents in SQL; ``database_url`` defaults to the configured one (embedded SQLite)."""

    def __init__(self, database_url: str | None = None, *, max_facts: int | None = None) -> None:
        """``max_facts`` overrides the configured cap (a host such as DeerFlow brings its own)."""
        config = get_memory_config()
        self._url = database_url if database_url is not None else database_url_from_config(config)
        self._sync_engine = get_engine(self._url)
        self._max_facts = config.max_facts if max_facts is None else max_facts
        self._tenant_max_facts = config.tenant_max_facts
        self._retention = RetentionPolicy.of(config)
        # A stuck lock on one scope must cost its own save a retry, not everyone's saves a wait.
        lock_ms = round(config.write_lock_timeout_seconds * 1000)
        self._write_options = {SQLITE_WRITE_OPTION: True, SQLITE_BUSY_TIMEOUT_OPTION: lock_ms}
        self._pg_timeouts = {
            "lock_timeout": f"{lock_ms}ms",
            "statement_timeout": f"{round(config.write_statement_timeout_seconds * 1000)}ms",
        }
        # The configured primary's storage reads from database_read_url when set (replica.py).
        read_url = config.database_read_url if self._url == database_url_from_config(config) else None
        self._routes = ReadRouter(self._sync_engine, read_url)
        self._insert_scope = INSERT_SCOPE[self._sync_engine.dialect.name]
        self._identity = DEFAULT_IDENTITY
        self._cache: dict[TenantScope, CacheEntry] = {}
        self._lock = threading.Lock()
        self.vectors = SqlVectorStore(
            self._routes,
            write_options=self._write_options,
            unavailable=self._unavailable,
        )
        self._access = (
            access.AccessRecorder(
                self._sync_engine,  # its flushes run on a thread of their own, on the sync face
                interval=config.access_interval_seconds,
                write_options=self._write_options,
                describe=self._describe,
            )
            if config.access_tracking
            else None
        )
        try:
            prepare_once(self._engine, auto_migrate=config.auto_migrate)
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc

    @property
    def _engine(self) -> Engine:
        """The engine of the calling face (``engine_for``): the sync one, or the loop's async one."""
        return engine_for(self._sync_engine)

    @property
    def identity(self) -> Identity:
        return self._identity

    def for_identity(
        self, tenant_id: str | None = None, roles: Iterable[str] | None = None
    ) -> SqlMemoryStorage:
        """A handle on the same engine, cache and vectors that acts inside ``tenant_id`` with ``roles``."""
        identity = Identity.of(None, tenant_id=tenant_id, roles=roles)
        if identity == self._identity:
            return self
        handle = copy.copy(self)
        handle._identity = identity
        handle.vectors = self.vectors.for_identity(identity)
        return handle

    def _key(self, scope: Scope) -> TenantScope:
        return (self._identity.tenant_id, *scope)

    def _acting(self, user_id: str | None) -> Identity:
        return replace(self._identity, user_id=user_id)

    def _reading(self, user_id: str | None) -> AbstractContextManager[Connection]:
        """A read on the primary (with the identity set where row-level security applies)."""
        return self._routes.primary(self._acting(user_id))

    @property
    def engine(self) -> Engine:
        """The process's engine for this database (the durable queue shares it)."""
        return self._sync_engine

    @property
    def url(self) -> str:
        """The database URL with any password masked."""
        return mask_url(self._url)

    def close(self) -> None:
        """Write pending access counts and forget cached documents; the engine (per process) stays open."""
        if self._access is not None:
            self._access.close()
        with self._lock:
            self._cache.clear()

    @timed_storage("load")
    def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        scope = resolve_scope(agent_name, user_id)
        key = self._key(scope)
        with self._lock:
            cached = self._cache.get(key)
        try:  # on the replica unless it misses this process's writes or goes back in time
            entry = read_twice(
                lambda: self._routes.load(
                    self._acting(scope[0]), key, lambda connect: self._fetch(connect, scope, cached), cached
                )
            )
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc
        return self._kept(scope, entry)

    @timed_storage("load")
    def reload(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        """The scope read from the primary, whatever the cache or the replica hold."""
        scope = resolve_scope(agent_name, user_id)
        try:
            return self._kept(
                scope, read_twice(lambda: self._fetch(lambda: self._reading(scope[0]), scope, None))
            )
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc

    def _fetch(self, connect: Connect, scope: Scope, cached: CacheEntry | None) -> CacheEntry | None:
        """The scope as ``connect``'s database holds it (``cached`` while its stamp is current
        there), or None when it holds no such scope."""
        keys = scope_keys(scope, self._identity.tenant_id)
        if cached is not None:
            with connect() as conn:
                row = conn.execute(STAMP_QUERY, keys).first()
            if row is not None and stamp(row) == cached.stamp:
                return cached
        with connect() as conn:
            return read_entry(conn, keys)

    def _kept(self, scope: Scope, entry: CacheEntry | None) -> MemoryDocument:
        """``entry`` cached (the scope forgotten when there is none) and a private copy of its document."""
        if entry is None:
            with self._lock:
                self._cache.pop(self._key(scope), None)
            document = unstored_memory()
            document["revision"] = 0
            return document
        document = entry.take()  # before the entry is cached: its first document is this caller's
        with self._lock:
            self._cache[self._key(scope)] = entry
        return document

    def _unavailable(self, exc: Exception, doing: str = "read memory") -> StorageUnavailableError:
        return StorageUnavailableError(f"cannot {doing} at {self.url}: {self._describe(exc)}")

    def _write_failed(self, exc: Exception, scope: Scope, doing: str) -> bool:
        """Log a failed write; an outage is raised so callers retry, anything else is ``False``."""
        logger.error("failed to %s (%s) at %s: %s", doing, scope_label(scope), self.url, self._describe(exc))
        if is_outage(exc):
            raise self._unavailable(exc, doing) from exc
        return False

    @timed_storage("save")
    def save(
        self,
        memory: MemoryDocument,
        agent_name: str | None = None,
        *,
        user_id: str | None = None,
        origin: str | None = None,
        captured_at: datetime | None = None,
        lease: QueueLease | None = None,
        removals: Mapping[str, Mapping[str, Any]] | None = None,
        confirmed: Collection[str] = (),
        folded: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    ) -> bool:
        """Merge ``memory`` into the scope (see ``merge.py``); ``origin`` is recorded in the audit trail.

        ``removals`` reach the audit rows of the facts the save tombstones as ``detail``;
        ``confirmed`` and ``folded`` facts get ``last_confirmed_at`` in the same transaction (no
        content change), and each fold an audit row of its own; a fold target another writer
        deleted raises ``FoldTargetGoneError`` and saves nothing.

        With a queue ``lease``, a save that changes anything also completes the leased queue row
        in the same transaction, and raises ``LeaseLostError`` (saving nothing) when another
        worker has taken the row over.

        A malformed document or a database error logs, returns False and changes nothing. An
        unreachable database (connection refused or lost, lock, statement or pool timeout) raises
        ``StorageUnavailableError`` instead, like ``load``: retrying later can succeed. A document
        loaded, or a conversation captured, before the scope was erased, cleared or vacuumed
        raises ``StaleDocumentError`` (see ``write.late_write``). A save that would share a fact, or
        change whom it is shared with, on a handle without the role ``editor`` or ``admin``
        (``for_identity``) raises ``AccessDeniedError`` and changes nothing.
        """
        scope = resolve_scope(agent_name, user_id)
        with self._lock:
            cached = self._cache.get(self._key(scope))
        try:
            if cached is None:
                incoming = parse_document(memory)
            else:
                known = cached.snapshot
                text = known.text if known.comparable else None
                incoming = parse_document(memory, known.facts, known.sections, text, known.incoming)
        except MalformedDocumentError as exc:
            logger.error("memory (%s) is malformed, not saved: %s", scope_label(scope), exc)
            return False
        try:
            saved = self._write(
                scope,
                incoming,
                (origin or DEFAULT_ORIGIN)[:MAX_ORIGIN],
                captured_at=captured_at,
                cached=cached,
                lease=lease,
                removals=removals or {},
                confirmed=[*confirmed, *(folded or {})],
                folded=folded or {},
            )
        except (SQLAlchemyError, UnicodeError) as exc:
            return self._write_failed(exc, scope, "save memory")
        if saved is not None:
            with self._lock:
                self._cache[self._key(scope)] = saved
        if confirmed or folded:  # confirmations move no revision
            self._routes.committed(self._identity.tenant_id)
        return True

    def clear(self, agent_name: str | None = None, *, user_id: str | None = None) -> bool:
        """Empty the scope and stamp ``cleared_at``, so updates captured earlier are dropped."""
        scope = resolve_scope(agent_name, user_id)
        try:
            self._write(scope, parse_document(create_empty_memory()), CLEAR_ORIGIN, clear=True)
        except SQLAlchemyError as exc:
            return self._write_failed(exc, scope, "clear memory")
        self._routes.committed(self._identity.tenant_id)  # an empty scope's clear moves no revision
        with self._lock:
            self._cache.pop(self._key(scope), None)
        return True

    def _describe(self, exc: Exception) -> str:
        return describe_db_error(exc, url=self._url)
