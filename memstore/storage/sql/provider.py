"""``SqlMemoryStorage``: the memory document kept in normalised SQL tables (SQLite or PostgreSQL).

Loads: one cheap revision query validates the per-instance cache; a miss reads the scope, its
sections and live facts in one UNION statement (one consistent snapshot, one round trip).

Saves: one transaction that takes the scope's write lock first (``BEGIN IMMEDIATE`` on SQLite,
``SELECT ... FOR UPDATE`` on PostgreSQL), merges the document into the stored rows (see
``merge.py``), writes only the rows that changed plus one audit row per change, and bumps the
scope's revision. A save that changes nothing writes nothing and keeps the revision.

The cache keeps, next to each document, a ``Snapshot`` of its rows. A save of a document loaded
at the revision the store is still at (the usual case: no concurrent writer) is parsed and planned
against the snapshot, without re-encoding unchanged facts or reading the rows, so its cost follows
the size of the change; anything else takes the full merge over the stored rows.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, cast

from sqlalchemy import (
    JSON,
    Connection,
    Engine,
    Row,
    Table,
    Text,
    and_,
    bindparam,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    type_coerce,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as SATimeoutError
from sqlalchemy.sql.elements import ColumnClause

from memstore.config import get_memory_config
from memstore.document import (
    HISTORY_SECTIONS,
    USER_SECTIONS,
    MemoryDocument,
    create_empty_memory,
    format_timestamp,
    new_fact_id,
)
from memstore.errors import MalformedDocumentError, StorageUnavailableError
from memstore.scope import Scope, resolve_scope
from memstore.storage.base import MemoryStorage
from memstore.storage.records import FactFilter, FactPage, HistoryEntry, MemoryStats
from memstore.storage.sql import maintenance, queries
from memstore.storage.sql.codec import (
    EMPTY_SECTION,
    FactValues,
    IncomingDocument,
    SectionValues,
    copy_json,
    decode_section,
    parse_document,
)
from memstore.storage.sql.engine import SQLITE_WRITE_OPTION, database_url_from_config, get_engine, mask_url
from memstore.storage.sql.merge import (
    MergePlan,
    Snapshot,
    StoredFact,
    StoredSection,
    plan_from_snapshot,
    plan_merge,
    snapshot_of,
)
from memstore.storage.sql.migrate import prepare_database
from memstore.storage.sql.models import Base

logger = logging.getLogger(__name__)

DEFAULT_ORIGIN = "unknown"
CLEAR_ORIGIN = "erase"
MAX_ORIGIN = 255

# (scope row id, revision, created_at): the row id and creation time catch a scope that was
# erased and re-created up to the same revision number.
_Stamp = tuple[int, int, datetime]
# What the cache holds per scope: the stamp, the document (never handed out: load copies it) and
# the snapshot a save plans against.
_Cached = tuple[_Stamp, MemoryDocument, Snapshot]
_AnyRow = Row[*tuple[Any, ...]]

_scopes: Table = Base.metadata.tables["memory_scopes"]
_sections: Table = Base.metadata.tables["memory_sections"]
_facts: Table = Base.metadata.tables["memory_facts"]
_history: Table = Base.metadata.tables["memory_history"]

# Literal '' (not a bound parameter) so the predicate matches the COALESCE unique index.
_EMPTY: ColumnClause[Any] = literal_column("''")
_SCOPE_MATCH = and_(
    func.coalesce(_scopes.c.user_id, _EMPTY) == bindparam("user_key"),
    func.coalesce(_scopes.c.agent_name, _EMPTY) == bindparam("agent_key"),
)
_SCOPE_COLUMNS = (
    _scopes.c.id.label("scope_id"),
    _scopes.c.revision,
    _scopes.c.version,
    _scopes.c.created_at.label("scope_created_at"),
    _scopes.c.updated_at.label("scope_updated_at"),
)

_STAMP_QUERY = select(_scopes.c.id, _scopes.c.revision, _scopes.c.created_at).where(_SCOPE_MATCH)
_LOCK_QUERY = (
    select(*_SCOPE_COLUMNS, _scopes.c.cleared_at, _scopes.c.purged_revision)
    .where(_SCOPE_MATCH)
    .with_for_update()
)
_MARK_CLEARED = (
    update(_scopes)
    .where(_scopes.c.id == bindparam("b_id"))
    .values(cleared_at=bindparam("b_now", type_=_scopes.c.cleared_at.type))
)
# Stamps and ``extra`` come back as the driver gives them (text on SQLite) and are parsed in
# _document_from_rows: SQLAlchemy's per-row DateTime/JSON processors were a third of a cold load.
_RAW = Text()
_LOAD_QUERY = union_all(
    select(
        *_SCOPE_COLUMNS,
        literal_column("'f'").label("kind"),
        _facts.c.fact_id.label("name"),
        _facts.c.position,
        _facts.c.content.label("text"),
        _facts.c.category,
        _facts.c.confidence,
        type_coerce(_facts.c.created_at, _RAW).label("stamp"),
        _facts.c.source,
        _facts.c.source_error,
        type_coerce(_facts.c.extra, _RAW).label("extra"),
    )
    .select_from(
        _scopes.outerjoin(
            _facts, and_(_facts.c.scope_id == _scopes.c.id, _facts.c.deleted_revision.is_(None))
        )
    )
    .where(_SCOPE_MATCH),
    select(
        *_SCOPE_COLUMNS,
        literal_column("'s'"),
        _sections.c.section,
        null(),
        _sections.c.summary,
        null(),
        null(),
        type_coerce(_sections.c.updated_at, _RAW),
        null(),
        null(),
        type_coerce(_sections.c.extra, _RAW),
    )
    .select_from(_scopes.join(_sections, _sections.c.scope_id == _scopes.c.id))
    .where(_SCOPE_MATCH),
)
_SECTIONS_QUERY = select(
    _sections.c.section, _sections.c.summary, _sections.c.updated_at, _sections.c.revision, _sections.c.extra
).where(_sections.c.scope_id == bindparam("scope_id"))
# Live rows plus the tombstones of ids the document mentions: never the whole tombstone history.
_FACTS_QUERY = select(
    _facts.c.id,
    _facts.c.fact_id,
    _facts.c.position,
    _facts.c.content,
    _facts.c.category,
    _facts.c.confidence,
    _facts.c.created_at,
    _facts.c.source,
    _facts.c.source_error,
    _facts.c.extra,
    _facts.c.added_revision,
    _facts.c.updated_revision,
    _facts.c.deleted_revision,
).where(
    _facts.c.scope_id == bindparam("scope_id"),
    or_(
        _facts.c.deleted_revision.is_(None),
        _facts.c.fact_id.in_(bindparam("fact_ids", expanding=True)),
    ),
)


_FACT_COLUMNS = (
    "position",
    "content",
    "content_key",
    "category",
    "confidence",
    "created_at",
    "source",
    "source_error",
    "extra",
    "updated_revision",
)
# Fact rows are addressed by (scope_id, fact_id), unique per scope: plans need no row ids.
_FACT_MATCH = and_(_facts.c.scope_id == bindparam("b_scope_id"), _facts.c.fact_id == bindparam("b_fact_id"))
_UPDATE_FACT = (
    update(_facts)
    .where(_FACT_MATCH)
    .values(**{name: bindparam("b_" + name, type_=_facts.c[name].type) for name in _FACT_COLUMNS})
)
_MOVE_FACT = update(_facts).where(_FACT_MATCH).values(position=bindparam("b_position"))
_TOMBSTONE_FACTS = (
    update(_facts)
    .where(
        _facts.c.scope_id == bindparam("b_scope_id"),
        _facts.c.fact_id.in_(bindparam("b_fact_ids", expanding=True)),
    )
    .values(
        deleted_revision=bindparam("b_revision"),
        deleted_at=bindparam("b_now", type_=_facts.c.deleted_at.type),
    )
)


def _insert_facts(dialect: Any) -> Any:
    """INSERT ... ON CONFLICT DO UPDATE: a new fact, or the revival of its tombstoned row.

    A fast-path save does not read tombstones, so it cannot tell the two apart; the database can.
    """
    statement = dialect.insert(_facts)
    revived = {name: statement.excluded[name] for name in (*_FACT_COLUMNS, "added_revision")}
    return statement.on_conflict_do_update(
        index_elements=[_facts.c.scope_id, _facts.c.fact_id],
        set_={**revived, "deleted_revision": None, "deleted_at": None},
    )


_INSERT_FACTS = {"sqlite": _insert_facts(sqlite), "postgresql": _insert_facts(postgresql)}
_UPDATE_SECTION = (
    update(_sections)
    .where(_sections.c.scope_id == bindparam("b_scope_id"), _sections.c.section == bindparam("b_section"))
    .values(
        summary=bindparam("b_summary"),
        updated_at=bindparam("b_updated_at", type_=_sections.c.updated_at.type),
        extra=bindparam("b_extra", type_=_sections.c.extra.type),
        revision=bindparam("b_revision"),
    )
)
_UPDATE_SCOPE = (
    update(_scopes)
    .where(_scopes.c.id == bindparam("b_id"))
    .values(
        revision=bindparam("b_revision"),
        version=bindparam("b_version"),
        updated_at=bindparam("b_now", type_=_scopes.c.updated_at.type),
    )
)
# before/after are SQL NULL (not JSON null) for inserts and deletes, so "before IS NULL" works.
_NULLABLE_JSON = JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
_INSERT_HISTORY = insert(_history).values(
    scope_id=bindparam("b_scope_id"),
    revision=bindparam("b_revision"),
    changed_at=bindparam("b_now", type_=_history.c.changed_at.type),
    entity=bindparam("b_entity"),
    entity_id=bindparam("b_entity_id"),
    action=bindparam("b_action"),
    origin=bindparam("b_origin"),
    before=bindparam("b_before", type_=_NULLABLE_JSON),
    after=bindparam("b_after", type_=_NULLABLE_JSON),
)


def _insert_scope(dialect: Any) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING: concurrent first saves of a scope create one row."""
    return (
        dialect.insert(_scopes)
        .values(
            user_id=bindparam("user_id"),
            agent_name=bindparam("agent_name"),
            revision=0,
            created_at=bindparam("now", type_=_scopes.c.created_at.type),
            updated_at=bindparam("now", type_=_scopes.c.updated_at.type),
        )
        .on_conflict_do_nothing()
    )


_INSERT_SCOPE = {"sqlite": _insert_scope(sqlite), "postgresql": _insert_scope(postgresql)}

_prepared: set[str] = set()
_prepared_lock = threading.Lock()


class SqlMemoryStorage(MemoryStorage):
    """Memory documents in SQL; ``database_url`` defaults to the configured one (embedded SQLite)."""

    def __init__(self, database_url: str | None = None) -> None:
        config = get_memory_config()
        self._url = database_url if database_url is not None else database_url_from_config(config)
        self._engine = get_engine(self._url)
        self._max_facts = config.max_facts
        # PostgreSQL reads run in autocommit: no BEGIN/ROLLBACK round trips around one SELECT.
        # (SQLite keeps its own BEGIN handling; its reads are in-process and cheap.)
        self._reader = (
            self._engine.execution_options(isolation_level="AUTOCOMMIT")
            if self._engine.dialect.name == "postgresql"
            else self._engine
        )
        self._insert_scope = _INSERT_SCOPE[self._engine.dialect.name]
        self._cache: dict[Scope, _Cached] = {}
        self._lock = threading.Lock()
        try:
            _prepare_once(self._engine, auto_migrate=config.auto_migrate)
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc

    @property
    def url(self) -> str:
        """The database URL with any password masked."""
        return mask_url(self._url)

    def close(self) -> None:
        """Forget cached documents; the engine is a per-process singleton and stays open."""
        with self._lock:
            self._cache.clear()

    def load(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        scope = resolve_scope(agent_name, user_id)
        with self._lock:
            cached = self._cache.get(scope)
        try:
            if cached is not None:
                with self._reader.connect() as conn:
                    row = conn.execute(_STAMP_QUERY, _scope_keys(scope)).first()
                if row is not None and _stamp(row) == cached[0]:
                    return cast(MemoryDocument, copy_json(cached[1]))
            return self._read(scope)
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc

    def reload(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        try:
            return self._read(resolve_scope(agent_name, user_id))
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: Exception, doing: str = "read memory") -> StorageUnavailableError:
        return StorageUnavailableError(f"cannot {doing} at {self.url}: {self._describe(exc)}")

    def _write_failed(self, exc: Exception, scope: Scope, doing: str) -> bool:
        """Log a failed write; an outage is raised so callers retry, anything else is ``False``."""
        logger.error("failed to %s for scope %s at %s: %s", doing, scope, self.url, self._describe(exc))
        if _is_outage(exc):
            raise self._unavailable(exc, doing) from exc
        return False

    def save(
        self,
        memory: MemoryDocument,
        agent_name: str | None = None,
        *,
        user_id: str | None = None,
        origin: str | None = None,
        captured_at: datetime | None = None,
    ) -> bool:
        """Merge ``memory`` into the scope (see ``merge.py``); ``origin`` is recorded in the audit trail.

        A malformed document or a database error logs, returns False and changes nothing. An
        unreachable database (connection refused or lost, lock or pool timeout) raises
        ``StorageUnavailableError`` instead, like ``load``: retrying later can succeed.
        """
        scope = resolve_scope(agent_name, user_id)
        with self._lock:
            cached = self._cache.get(scope)
        try:
            if cached is None:
                incoming = parse_document(memory)
            else:
                incoming = parse_document(memory, cached[2].facts, cached[2].sections)
        except MalformedDocumentError as exc:
            logger.error("memory for scope %s is malformed, not saved: %s", scope, exc)
            return False
        try:
            saved = self._write(
                scope,
                incoming,
                (origin or DEFAULT_ORIGIN)[:MAX_ORIGIN],
                captured_at=captured_at,
                cached=cached,
            )
        except (SQLAlchemyError, UnicodeError) as exc:
            return self._write_failed(exc, scope, "save memory")
        if saved is not None:
            with self._lock:
                self._cache[scope] = saved
        return True

    def _read(self, scope: Scope) -> MemoryDocument:
        with self._reader.connect() as conn:
            rows = conn.execute(_LOAD_QUERY, _scope_keys(scope)).all()
        if not rows:
            with self._lock:
                self._cache.pop(scope, None)
            document = create_empty_memory()
            document["revision"] = 0
            return document
        cached = _cached_from_rows(rows)
        with self._lock:
            self._cache[scope] = cached
        return cast(MemoryDocument, copy_json(cached[1]))

    # --- StorageOperations (memstore.ops.queries): cross-scope reads and maintenance -------------

    def query_facts(self, where: FactFilter, *, search: str | None, limit: int, offset: int) -> FactPage:
        return queries.query_facts(self._reader, where, search=search, limit=limit, offset=offset)

    def stats(self) -> MemoryStats:
        return queries.memory_stats(self._reader)

    def list_scopes(self, user_id: str | None = None) -> list[Scope]:
        return queries.list_scopes(self._reader, user_id)

    def history(self, where: FactFilter, *, fact_id: str | None, limit: int) -> list[HistoryEntry]:
        return queries.fact_history(self._reader, where, fact_id=fact_id, limit=limit)

    def erase_user(self, user_id: str) -> dict[str, int]:
        counts = maintenance.erase_user(self._engine, user_id, datetime.now(UTC))
        with self._lock:
            for scope in [scope for scope in self._cache if scope[0] == user_id]:
                del self._cache[scope]
        return counts

    def vacuum(self, cutoff: datetime) -> dict[str, int]:
        return maintenance.vacuum(self._engine, cutoff)

    def clear(self, agent_name: str | None = None, *, user_id: str | None = None) -> bool:
        """Empty the scope and stamp ``cleared_at``, so updates captured earlier are dropped."""
        scope = resolve_scope(agent_name, user_id)
        try:
            self._write(scope, parse_document(create_empty_memory()), CLEAR_ORIGIN, clear=True)
        except SQLAlchemyError as exc:
            return self._write_failed(exc, scope, "clear memory")
        with self._lock:
            self._cache.pop(scope, None)
        return True

    def _write(
        self,
        scope: Scope,
        incoming: IncomingDocument,
        origin: str,
        *,
        captured_at: datetime | None = None,
        clear: bool = False,
        cached: _Cached | None = None,
    ) -> _Cached | None:
        """Run the save transaction; returns what to cache, or None when there is nothing to cache.

        ``cached`` is the cache entry ``incoming`` was parsed against, for the fast path.
        """
        keys = _scope_keys(scope)
        now = datetime.now(UTC)
        with self._engine.connect() as conn:
            conn.execution_options(**{SQLITE_WRITE_OPTION: True})
            with conn.begin() as transaction:
                scope_row = conn.execute(_LOCK_QUERY, keys).first()
                created = scope_row is None
                if scope_row is None:
                    conn.execute(
                        self._insert_scope, {"user_id": scope[0], "agent_name": scope[1], "now": now}
                    )
                    scope_row = conn.execute(_LOCK_QUERY, keys).one()
                refusal = _late_write(conn, scope, scope_row, incoming, captured_at, created=created)
                if refusal is not None:
                    transaction.rollback()
                    logger.warning("memory update for scope %s dropped: %s", scope, refusal)
                    return None
                if clear:
                    conn.execute(_MARK_CLEARED, {"b_id": scope_row.scope_id, "b_now": now})
                plan = self._plan(conn, scope_row, incoming, cached)
                if not plan.changed and clear:
                    return None
                if not plan.changed:
                    transaction.rollback()
                    if created:
                        return None
                    return _cached_after(
                        scope_row,
                        scope_row.version,
                        scope_row.scope_updated_at,
                        scope_row.revision,
                        plan,
                        cached,
                    )
                _apply(conn, scope_row.scope_id, plan, now, origin)
                conn.execute(
                    _UPDATE_SCOPE,
                    {
                        "b_id": scope_row.scope_id,
                        "b_revision": plan.revision,
                        "b_version": plan.version or scope_row.version,
                        "b_now": now,
                    },
                )
        return _cached_after(scope_row, plan.version or scope_row.version, now, plan.revision, plan, cached)

    def _plan(
        self, conn: Connection, scope_row: _AnyRow, incoming: IncomingDocument, cached: _Cached | None
    ) -> MergePlan:
        """Plan against the cached snapshot if store and caller are both at its revision, else the rows."""
        current = scope_row.revision
        if cached is not None and incoming.revision == current and cached[0] == _stamp_of(scope_row, current):
            plan = plan_from_snapshot(
                incoming,
                cached[2],
                current=current,
                stored_version=scope_row.version,
                max_facts=self._max_facts,
            )
            if plan is not None:
                return plan
        scope_id = scope_row.scope_id
        sections = {
            row.section: StoredSection(
                SectionValues(row.summary, _utc(row.updated_at), _json_object(row.extra)), row.revision
            )
            for row in conn.execute(_SECTIONS_QUERY, {"scope_id": scope_id})
        }
        fact_ids = [fact.values.fact_id for fact in incoming.facts or ()]
        facts = [
            StoredFact(
                row_id=row.id,
                values=_fact_values(row),
                position=row.position,
                added_revision=row.added_revision,
                updated_revision=row.updated_revision,
                deleted_revision=row.deleted_revision,
            )
            for row in conn.execute(_FACTS_QUERY, {"scope_id": scope_id, "fact_ids": fact_ids})
        ]
        return plan_merge(
            incoming,
            stored_facts=facts,
            stored_sections=sections,
            stored_version=scope_row.version,
            current=current,
            max_facts=self._max_facts,
            new_id=new_fact_id,
        )

    def _describe(self, exc: Exception) -> str:
        """The driver's message (not the SQL and its parameters), with any password scrubbed."""
        message = str(exc.orig) if isinstance(exc, DBAPIError) else str(exc)
        try:
            password = make_url(self._url).password
        except Exception:
            password = None
        if password:
            message = message.replace(str(password), "***")
        return message


def _late_write(
    conn: Connection,
    scope: Scope,
    scope_row: _AnyRow,
    incoming: IncomingDocument,
    captured_at: datetime | None,
    *,
    created: bool,
) -> str | None:
    """Why this save must not land (it would bring back erased or purged memory), or None."""
    revision = incoming.revision
    if revision is not None and revision > scope_row.revision:
        if created:
            return f"the document was loaded at revision {revision} but the scope was erased since"
        return f"the document carries revision {revision} but the store is at {scope_row.revision} (erased)"
    if revision is not None and revision < scope_row.purged_revision:
        return (
            f"the document was loaded at revision {revision}, before tombstones up to revision "
            f"{scope_row.purged_revision} were vacuumed"
        )
    if captured_at is None:
        return None
    cleared = _utc(scope_row.cleared_at)
    if cleared is not None and cleared > captured_at:
        return "the scope was cleared after the conversation was captured"
    erased = _utc(maintenance.erased_at(conn, scope[0])) if scope[0] is not None else None
    if erased is not None and erased > captured_at:
        return "the user was erased after the conversation was captured"
    return None


def _is_outage(exc: BaseException) -> bool:
    """Errors that say "the database is not reachable right now", as opposed to "this write is wrong"."""
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError)
    return isinstance(exc, SATimeoutError | DisconnectionError)


def _prepare_once(engine: Engine, *, auto_migrate: bool) -> None:
    """Schema check/migration once per database per process, not once per storage instance."""
    key = engine.url.render_as_string(hide_password=False)
    with _prepared_lock:
        if key in _prepared:
            return
        prepare_database(engine, auto_migrate=auto_migrate)
        _prepared.add(key)


def _apply(conn: Connection, scope_id: int, plan: MergePlan, now: datetime, origin: str) -> None:
    """Write the plan: tombstones first, so a re-added content key never meets its old live row."""
    revision = plan.revision
    if plan.tombstones:
        conn.execute(
            _TOMBSTONE_FACTS,
            {"b_scope_id": scope_id, "b_fact_ids": plan.tombstones, "b_revision": revision, "b_now": now},
        )
    if plan.updates:
        conn.execute(_UPDATE_FACT, [_fact_row(scope_id, v, pos, revision) for v, pos in plan.updates])
    if plan.moves:
        conn.execute(
            _MOVE_FACT,
            [
                {"b_scope_id": scope_id, "b_fact_id": fact_id, "b_position": pos}
                for fact_id, pos in plan.moves
            ],
        )
    if plan.inserts:
        conn.execute(
            _INSERT_FACTS[conn.dialect.name],
            [
                {
                    "scope_id": scope_id,
                    "fact_id": values.fact_id,
                    **_columns(values),
                    "position": position,
                    "added_revision": revision,
                    "updated_revision": revision,
                }
                for values, position in plan.inserts
            ],
        )
    if plan.section_inserts:
        conn.execute(
            insert(_sections),
            [
                {
                    "scope_id": scope_id,
                    "section": name,
                    "summary": values.summary,
                    "updated_at": values.updated_at,
                    "extra": values.extra,
                    "revision": revision,
                }
                for name, values in plan.section_inserts
            ],
        )
    if plan.section_updates:
        conn.execute(
            _UPDATE_SECTION,
            [
                {
                    "b_scope_id": scope_id,
                    "b_section": name,
                    "b_summary": values.summary,
                    "b_updated_at": values.updated_at,
                    "b_extra": values.extra,
                    "b_revision": revision,
                }
                for name, values in plan.section_updates
            ],
        )
    if plan.changes:
        conn.execute(
            _INSERT_HISTORY,
            [
                {
                    "b_scope_id": scope_id,
                    "b_revision": revision,
                    "b_now": now,
                    "b_entity": change.entity,
                    "b_entity_id": change.entity_id,
                    "b_action": change.action,
                    "b_origin": origin,
                    "b_before": change.before,
                    "b_after": change.after,
                }
                for change in plan.changes
            ],
        )


def _columns(values: FactValues) -> dict[str, Any]:
    return {
        "content": values.content,
        "content_key": values.content_key,
        "category": values.category,
        "confidence": values.confidence,
        "created_at": values.created_at,
        "source": values.source,
        "source_error": values.source_error,
        "extra": values.extra,
    }


def _fact_row(scope_id: int, values: FactValues, position: int, revision: int) -> dict[str, Any]:
    params = {"b_" + name: value for name, value in _columns(values).items()}
    params.update(
        b_scope_id=scope_id, b_fact_id=values.fact_id, b_position=position, b_updated_revision=revision
    )
    return params


def _scope_keys(scope: Scope) -> dict[str, str]:
    return {"user_key": scope[0] or "", "agent_key": scope[1] or ""}


def _utc(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; everything stored is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _stamp(row: _AnyRow) -> _Stamp:
    return (row.id, row.revision, _utc(row.created_at) or datetime.min)


def _stamp_of(scope_row: _AnyRow, revision: int) -> _Stamp:
    return (scope_row.scope_id, revision, _utc(scope_row.scope_created_at) or datetime.min)


def _json_object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _fact_values(row: _AnyRow) -> FactValues:
    return FactValues(
        fact_id=row.fact_id,
        content=row.content,
        category=row.category,
        confidence=row.confidence,
        created_at=_utc(row.created_at),
        source=row.source,
        source_error=row.source_error,
        extra=_json_object(row.extra),
    )


def _raw_timestamp(value: datetime | str | None) -> datetime | None:
    """A stamp as _LOAD_QUERY returns it: ISO text on SQLite, a datetime from psycopg."""
    return _utc(datetime.fromisoformat(value) if isinstance(value, str) else value)


def _raw_json(value: object) -> dict[str, Any]:
    """An ``extra`` as _LOAD_QUERY returns it: JSON text on SQLite (nearly always ``{}``), a dict on PG."""
    if isinstance(value, str):
        return {} if value == "{}" else _json_object(json.loads(value))
    return _json_object(value)


def _cached_from_rows(rows: Sequence[_AnyRow]) -> _Cached:
    """The cache entry from the UNION rows (every row repeats the scope's columns).

    Rows are unpacked by position: named attribute access on ~100 rows cost more than the query.
    """
    first = rows[0]
    facts: list[tuple[int, str, FactValues]] = []
    sections: dict[str, SectionValues] = {}
    for *_, kind, name, position, text, category, confidence, stamp, source, source_error, extra in rows:
        if name is None:
            continue
        if kind == "f":
            values = FactValues(
                fact_id=name,
                content=text,
                category=category,
                confidence=confidence,
                created_at=_raw_timestamp(stamp),
                source=source,
                source_error=source_error,
                extra=_raw_json(extra),
            )
            facts.append((position, name, values))
        else:
            sections[name] = SectionValues(text, _raw_timestamp(stamp), _raw_json(extra))
    facts.sort(key=lambda item: (item[0], item[1]))
    snapshot = snapshot_of([item[2] for item in facts], [item[0] for item in facts], sections)
    document = _document(first.version, first.scope_updated_at, first.revision, snapshot)
    return _stamp_of(first, first.revision), document, snapshot


def _cached_after(
    scope_row: _AnyRow,
    version: str,
    updated_at: datetime,
    revision: int,
    plan: MergePlan,
    previous: _Cached | None,
) -> _Cached:
    """The cache entry for the scope as the plan leaves it, reusing what ``previous`` decoded."""
    snapshot = snapshot_of(plan.facts, plan.positions, plan.sections, previous[2] if previous else None)
    return _stamp_of(scope_row, revision), _document(version, updated_at, revision, snapshot), snapshot


_RAW_FACT = attrgetter("raw")


def _document(version: str, updated_at: datetime, revision: int, snapshot: Snapshot) -> MemoryDocument:
    """The document of a snapshot; it shares the snapshot's (never mutated) fact and section dicts."""

    def group(names: tuple[str, ...]) -> dict[str, Any]:
        return {
            name: known.raw if (known := snapshot.sections.get(name)) else decode_section(EMPTY_SECTION)
            for name in names
        }

    return {
        "version": version,
        "lastUpdated": format_timestamp(updated_at),
        "revision": revision,
        "user": group(USER_SECTIONS),
        "history": group(HISTORY_SECTIONS),
        "facts": list(map(_RAW_FACT, snapshot.facts.values())),
    }
