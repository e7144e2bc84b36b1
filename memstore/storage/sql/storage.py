"""``SqlMemoryStorage``: the memory document kept in normalised SQL tables (SQLite or PostgreSQL).

Loads: one cheap revision query validates the per-instance cache; a miss reads the scope, its
sections and live facts in one UNION statement (one consistent snapshot, one round trip).

Saves: one transaction that takes the scope's write lock first (``BEGIN IMMEDIATE`` on SQLite,
``SELECT ... FOR UPDATE`` on PostgreSQL), merges the document into the stored rows (see
``merge.py``), writes only the rows that changed plus one audit row per change, and bumps the
scope's revision. A save that changes nothing writes nothing and keeps the revision.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    Connection,
    Engine,
    Row,
    Table,
    and_,
    bindparam,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.sql.elements import ColumnClause

from memstore.config import get_memory_config
from memstore.document import (
    HISTORY_SECTIONS,
    USER_SECTIONS,
    MemoryDocument,
    create_empty_memory,
    new_fact_id,
)
from memstore.errors import StorageUnavailableError
from memstore.scope import Scope, resolve_scope
from memstore.storage.base import MemoryStorage
from memstore.storage.sql.codec import (
    EMPTY_SECTION,
    FactValues,
    IncomingDocument,
    MalformedDocumentError,
    SectionValues,
    decode_fact,
    decode_section,
    format_timestamp,
    parse_document,
)
from memstore.storage.sql.engine import SQLITE_WRITE_OPTION, database_url_from_config, get_engine, mask_url
from memstore.storage.sql.merge import MergePlan, StoredFact, StoredSection, plan_merge
from memstore.storage.sql.migrate import prepare_database
from memstore.storage.sql.models import Base

logger = logging.getLogger(__name__)

DEFAULT_ORIGIN = "unknown"
MAX_ORIGIN = 255

# (scope row id, revision, created_at): the row id and creation time catch a scope that was
# erased and re-created up to the same revision number.
_Stamp = tuple[int, int, datetime]
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
_LOCK_QUERY = select(*_SCOPE_COLUMNS).where(_SCOPE_MATCH).with_for_update()
_LOAD_QUERY = union_all(
    select(
        *_SCOPE_COLUMNS,
        literal_column("'f'").label("kind"),
        _facts.c.fact_id.label("name"),
        _facts.c.position,
        _facts.c.content.label("text"),
        _facts.c.category,
        _facts.c.confidence,
        _facts.c.created_at.label("stamp"),
        _facts.c.source,
        _facts.c.source_error,
        _facts.c.extra,
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
        _sections.c.updated_at,
        null(),
        null(),
        _sections.c.extra,
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


def _fact_params(prefix: str = "b_") -> dict[str, Any]:
    columns = (
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
    return {name: bindparam(prefix + name, type_=_facts.c[name].type) for name in columns}


_UPDATE_FACT = update(_facts).where(_facts.c.id == bindparam("b_id")).values(**_fact_params())
_REVIVE_FACT = (
    update(_facts)
    .where(_facts.c.id == bindparam("b_id"))
    .values(
        **_fact_params(),
        added_revision=bindparam("b_updated_revision"),
        deleted_revision=None,
        deleted_at=None,
    )
)
_MOVE_FACT = update(_facts).where(_facts.c.id == bindparam("b_id")).values(position=bindparam("b_position"))
_TOMBSTONE_FACTS = (
    update(_facts)
    .where(_facts.c.id.in_(bindparam("b_ids", expanding=True)))
    .values(
        deleted_revision=bindparam("b_revision"),
        deleted_at=bindparam("b_now", type_=_facts.c.deleted_at.type),
    )
)
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
        self._cache: dict[Scope, tuple[_Stamp, MemoryDocument]] = {}
        self._lock = threading.Lock()
        _prepare_once(self._engine, auto_migrate=config.auto_migrate)

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
                    return cast(MemoryDocument, _copy_json(cached[1]))
            return self._read(scope)
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc

    def reload(self, agent_name: str | None = None, *, user_id: str | None = None) -> MemoryDocument:
        try:
            return self._read(resolve_scope(agent_name, user_id))
        except DBAPIError as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: DBAPIError) -> StorageUnavailableError:
        return StorageUnavailableError(f"cannot read memory from {self.url}: {self._describe(exc)}")

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

        A malformed document or a database error logs, returns False and changes nothing.
        """
        scope = resolve_scope(agent_name, user_id)
        try:
            incoming = parse_document(memory)
        except MalformedDocumentError as exc:
            logger.error("memory for scope %s is malformed, not saved: %s", scope, exc)
            return False
        try:
            saved = self._write(scope, incoming, (origin or DEFAULT_ORIGIN)[:MAX_ORIGIN])
        except (SQLAlchemyError, UnicodeError) as exc:
            logger.error("failed to save memory for scope %s to %s: %s", scope, self.url, self._describe(exc))
            return False
        if saved is not None:
            # Stored values may share objects with the caller's dict: cache a private copy.
            cached = (saved[0], _copy_json(saved[1]))
            with self._lock:
                self._cache[scope] = cached
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
        stamp, document = _document_from_rows(rows)
        with self._lock:
            self._cache[scope] = (stamp, document)
        return cast(MemoryDocument, _copy_json(document))

    def _write(
        self, scope: Scope, incoming: IncomingDocument, origin: str
    ) -> tuple[_Stamp, MemoryDocument] | None:
        """Run the save transaction; returns what to cache, or None when there is nothing to cache."""
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
                plan = self._plan(conn, scope, scope_row, incoming)
                if not plan.changed:
                    transaction.rollback()
                    if created:
                        return None
                    return _stamp_of(scope_row, scope_row.revision), _document(
                        scope_row.version, scope_row.scope_updated_at, scope_row.revision, plan
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
        version = plan.version or scope_row.version
        return _stamp_of(scope_row, plan.revision), _document(version, now, plan.revision, plan)

    def _plan(
        self, conn: Connection, scope: Scope, scope_row: _AnyRow, incoming: IncomingDocument
    ) -> MergePlan:
        scope_id = scope_row.scope_id
        if incoming.revision is not None and incoming.revision > scope_row.revision:
            logger.warning(
                "memory for scope %s carries revision %d but the store is at %d "
                "(erased and re-created?); saving it as if it were current",
                scope,
                incoming.revision,
                scope_row.revision,
            )
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
            current=scope_row.revision,
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
        conn.execute(_TOMBSTONE_FACTS, {"b_ids": plan.tombstones, "b_revision": revision, "b_now": now})
    if plan.updates:
        conn.execute(_UPDATE_FACT, [_fact_row(row_id, v, pos, revision) for row_id, v, pos in plan.updates])
    if plan.moves:
        conn.execute(_MOVE_FACT, [{"b_id": row_id, "b_position": pos} for row_id, pos in plan.moves])
    if plan.revives:
        conn.execute(_REVIVE_FACT, [_fact_row(row_id, v, pos, revision) for row_id, v, pos in plan.revives])
    if plan.inserts:
        conn.execute(
            insert(_facts),
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


def _fact_row(row_id: int, values: FactValues, position: int, revision: int) -> dict[str, Any]:
    params = {"b_" + name: value for name, value in _columns(values).items()}
    params.update(b_id=row_id, b_position=position, b_updated_revision=revision)
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


def _document_from_rows(rows: Sequence[_AnyRow]) -> tuple[_Stamp, MemoryDocument]:
    """Build the document from the UNION rows (every row repeats the scope's columns)."""
    first = rows[0]
    facts: list[tuple[int, str, FactValues]] = []
    sections: dict[str, SectionValues] = {}
    for row in rows:
        if row.name is None:
            continue
        if row.kind == "f":
            values = FactValues(
                fact_id=row.name,
                content=row.text,
                category=row.category,
                confidence=row.confidence,
                created_at=_utc(row.stamp),
                source=row.source,
                source_error=row.source_error,
                extra=_json_object(row.extra),
            )
            facts.append((row.position, row.name, values))
        else:
            sections[row.name] = SectionValues(row.text, _utc(row.stamp), _json_object(row.extra))
    facts.sort(key=lambda item: (item[0], item[1]))
    document = _build_document(
        first.version, first.scope_updated_at, first.revision, sections, [item[2] for item in facts]
    )
    return _stamp_of(first, first.revision), document


def _document(version: str, updated_at: datetime, revision: int, plan: MergePlan) -> MemoryDocument:
    return _build_document(version, updated_at, revision, plan.sections, plan.facts)


def _build_document(
    version: str,
    updated_at: datetime,
    revision: int,
    sections: dict[str, SectionValues],
    facts: list[FactValues],
) -> MemoryDocument:
    def group(names: tuple[str, ...]) -> dict[str, Any]:
        return {name: decode_section(sections.get(name, EMPTY_SECTION)) for name in names}

    return {
        "version": version,
        "lastUpdated": format_timestamp(updated_at),
        "revision": revision,
        "user": group(USER_SECTIONS),
        "history": group(HISTORY_SECTIONS),
        "facts": [decode_fact(values) for values in facts],
    }


def _copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data, several times faster than ``copy.deepcopy``."""
    if isinstance(value, dict):
        return {key: _copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy_json(item) for item in value]
    return value
