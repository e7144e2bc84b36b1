"""Every SQL statement the provider runs on the document path, built once at import.

Loads, the write lock, fact and section writes, the scope bump and audit inserts. Cross-scope
queries live in ``queries.py`` and maintenance in ``maintenance.py``. The ``RUN_*`` ones, which
every save runs, go through the driver's cursor (``driver.DriverStatement``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    JSON,
    Connection,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnClause, ColumnElement

from memstore.document import as_utc
from memstore.scope import Scope, validate_user_id
from memstore.storage.sql.driver import DriverStatement
from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.schema.models import grants_table as _grants
from memstore.storage.sql.schema.models import history_table as _history
from memstore.storage.sql.schema.models import relations_table as _relations
from memstore.storage.sql.schema.models import scopes_table as _scopes
from memstore.storage.sql.schema.models import sections_table as _sections
from memstore.storage.sql.schema.models import tags_table as _tags

# Literal '' (not a bound parameter) so the predicate matches the COALESCE unique index.
_EMPTY: ColumnClause[Any] = literal_column("''")
SCOPE_MATCH = and_(
    _scopes.c.tenant_id == bindparam("tenant_key"),
    func.coalesce(_scopes.c.user_id, _EMPTY) == bindparam("user_key"),
    func.coalesce(_scopes.c.agent_name, _EMPTY) == bindparam("agent_key"),
)


def user_is(user_id: str) -> ColumnElement[bool]:
    """``memory_scopes.user_id = user_id``, written so the COALESCE unique index serves it.

    A plain ``user_id = ?`` has no index to use: with 50,000 users it scanned every scope, or
    every fact of the category a filter names. The id is validated first: ``''`` would match
    every scope that has no user (the global and agent-only memory), and an erase must not.
    """
    return func.coalesce(_scopes.c.user_id, _EMPTY) == validate_user_id(user_id)


def agent_is(agent_name: str | None) -> ColumnElement[bool]:
    """``agent_name = agent_name`` (``IS NULL`` for None: ``''`` is never a name), index-friendly."""
    return func.coalesce(_scopes.c.agent_name, _EMPTY) == (agent_name or _EMPTY)


_SCOPE_COLUMNS = (
    _scopes.c.id.label("scope_id"),
    _scopes.c.revision,
    _scopes.c.version,
    _scopes.c.created_at.label("scope_created_at"),
    _scopes.c.updated_at.label("scope_updated_at"),
)

SCOPE_ID = select(_scopes.c.id).where(SCOPE_MATCH).scalar_subquery()
"""The scope's row id, bound by ``scope_keys``: for statements that address facts by scope."""
STAMP_QUERY = select(_scopes.c.id, _scopes.c.revision, _scopes.c.created_at).where(SCOPE_MATCH)
LOCK_QUERY = (
    select(*_SCOPE_COLUMNS, _scopes.c.cleared_at, _scopes.c.purged_revision)
    .where(SCOPE_MATCH)
    .with_for_update()
)
_LOCK = DriverStatement(LOCK_QUERY)


class ScopeRow(NamedTuple):
    """The scope row a save locks (``LOCK_QUERY``)."""

    scope_id: int
    revision: int
    version: str
    scope_created_at: datetime
    scope_updated_at: datetime
    cleared_at: datetime | None
    purged_revision: int


def lock_scope(conn: Connection, keys: dict[str, str]) -> ScopeRow | None:
    """Lock the scope ``keys`` names for this transaction and read it; None when there is none."""
    rows = _LOCK.run(conn, keys)
    if not rows:
        return None
    scope_id, revision, version, created_at, updated_at, cleared_at, purged_revision = rows[0]
    cleared = None if cleared_at is None else scope_time(cleared_at)
    return ScopeRow(
        scope_id, revision, version, scope_time(created_at), scope_time(updated_at), cleared, purged_revision
    )


def scope_time(value: datetime | str) -> datetime:
    """A scope row's stamp from the driver: a datetime from psycopg, SQLAlchemy's text from SQLite
    (``YYYY-MM-DD HH:MM:SS.ffffff``, UTC)."""
    parsed = datetime.fromisoformat(value) if isinstance(value, str) else value
    return as_utc(parsed) or datetime.min


# PostgreSQL's SET LOCAL, as one statement that takes bind parameters: both end with the transaction.
WRITE_TIMEOUTS = select(
    func.set_config("lock_timeout", bindparam("lock_timeout"), true()),
    func.set_config("statement_timeout", bindparam("statement_timeout"), true()),
)
RUN_WRITE_TIMEOUTS = DriverStatement(WRITE_TIMEOUTS)
MARK_CLEARED = (
    update(_scopes)
    .where(_scopes.c.id == bindparam("b_id"))
    .values(cleared_at=bindparam("b_now", type_=_scopes.c.cleared_at.type))
)
SECTIONS_QUERY = select(
    _sections.c.section, _sections.c.summary, _sections.c.updated_at, _sections.c.revision, _sections.c.extra
).where(_sections.c.scope_id == bindparam("scope_id"))
MAX_BOUND_IDS = 900
"""Ids bound into one ``IN`` list. Every SQLite build allows 999 variables per statement (newer ones
32,766 or 250,000) and PostgreSQL 65,535; a document may name any number of facts."""
_STORED_FACT = select(
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
    _facts.c.last_confirmed_at,
    _facts.c.last_accessed_at,
    _facts.c.access_count,
    _facts.c.visibility,
    _facts.c.memory_type,
    _facts.c.importance,
    _facts.c.source_kind,
    _facts.c.raw,
    _facts.c.structured,
)
_NAMED = _facts.c.fact_id.in_(bindparam("fact_ids", expanding=True))
# Live rows plus the tombstones of ids the document mentions: never the whole tombstone history.
# At most MAX_BOUND_IDS ids each: TOMBSTONES_QUERY reads the tombstones of the ids beyond them.
FACTS_QUERY = _STORED_FACT.where(
    _facts.c.scope_id == bindparam("scope_id"), or_(_facts.c.deleted_revision.is_(None), _NAMED)
)
TOMBSTONES_QUERY = _STORED_FACT.where(
    _facts.c.scope_id == bindparam("scope_id"), _facts.c.deleted_revision.is_not(None), _NAMED
)


FACT_COLUMNS = (
    "position",
    "content",
    "content_key",
    "category",
    "confidence",
    "created_at",
    "source",
    "source_error",
    "extra",
    "visibility",
    "memory_type",
    "importance",
    "source_kind",
    "raw",
    "structured",
    "updated_revision",
)
# Fact rows are addressed by (scope_id, fact_id), unique per scope: plans need no row ids.
_FACT_MATCH = and_(_facts.c.scope_id == bindparam("b_scope_id"), _facts.c.fact_id == bindparam("b_fact_id"))
# Every content change is a new version of the fact (retention signals and moves are not).
UPDATE_FACT = (
    update(_facts)
    .where(_FACT_MATCH)
    .values(
        **{name: bindparam("b_" + name, type_=_facts.c[name].type) for name in FACT_COLUMNS},
        version=_facts.c.version + 1,
    )
)
MOVE_FACT = update(_facts).where(_FACT_MATCH).values(position=bindparam("b_position"))
TOMBSTONE_FACTS = (
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
    revived = {name: statement.excluded[name] for name in (*FACT_COLUMNS, "added_revision")}
    return statement.on_conflict_do_update(
        index_elements=[_facts.c.scope_id, _facts.c.fact_id],
        # A revived fact starts its retention signals afresh, like a new one.
        set_={
            **revived,
            "deleted_revision": None,
            "deleted_at": None,
            "version": _facts.c.version + 1,
            "last_confirmed_at": None,
            "last_accessed_at": None,
            "access_count": 0,
        },
    )


INSERT_FACTS = {"sqlite": _insert_facts(sqlite), "postgresql": _insert_facts(postgresql)}
RUN_INSERT_FACTS = {dialect: DriverStatement(statement) for dialect, statement in INSERT_FACTS.items()}
UPDATE_SECTION = (
    update(_sections)
    .where(_sections.c.scope_id == bindparam("b_scope_id"), _sections.c.section == bindparam("b_section"))
    .values(
        summary=bindparam("b_summary"),
        updated_at=bindparam("b_updated_at", type_=_sections.c.updated_at.type),
        extra=bindparam("b_extra", type_=_sections.c.extra.type),
        revision=bindparam("b_revision"),
    )
)
UPDATE_SCOPE = (
    update(_scopes)
    .where(_scopes.c.id == bindparam("b_id"))
    .values(
        revision=bindparam("b_revision"),
        version=bindparam("b_version"),
        updated_at=bindparam("b_now", type_=_scopes.c.updated_at.type),
    )
)
RUN_UPDATE_SCOPE = DriverStatement(UPDATE_SCOPE)
# before/after are SQL NULL (not JSON null) for inserts and deletes, so "before IS NULL" works.
_NULLABLE_JSON = JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
INSERT_HISTORY = insert(_history).values(
    scope_id=bindparam("b_scope_id"),
    revision=bindparam("b_revision"),
    changed_at=bindparam("b_now", type_=_history.c.changed_at.type),
    entity=bindparam("b_entity"),
    entity_id=bindparam("b_entity_id"),
    action=bindparam("b_action"),
    origin=bindparam("b_origin"),
    before=bindparam("b_before", type_=_NULLABLE_JSON),
    after=bindparam("b_after", type_=_NULLABLE_JSON),
    detail=bindparam("b_detail", type_=_NULLABLE_JSON),
    # The fact's version as the save left it (its row is written before the audit rows).
    version=select(_facts.c.version)
    .where(
        bindparam("b_entity") == "fact",
        _facts.c.scope_id == bindparam("b_scope_id"),
        _facts.c.fact_id == bindparam("b_entity_id"),
    )
    .scalar_subquery(),
)
RUN_INSERT_HISTORY = DriverStatement(INSERT_HISTORY)
# A merged fact takes over its sources' signals (``write.inherit_signals``).
SET_SIGNALS = (
    update(_facts)
    .where(
        _facts.c.scope_id == bindparam("b_scope_id"),
        _facts.c.fact_id == bindparam("b_fact_id"),
        _facts.c.deleted_revision.is_(None),
    )
    .values(
        last_confirmed_at=bindparam("b_confirmed", type_=_facts.c.last_confirmed_at.type),
        last_accessed_at=bindparam("b_accessed", type_=_facts.c.last_accessed_at.type),
        access_count=bindparam("b_count"),
    )
)
# A host that evicts itself (DeerMem) reports why after its save: the deletion that save made (at
# the scope's current revision) learns it; an older deletion (a person's) never does.
_LATEST_DELETION = (
    select(func.max(_history.c.id))
    .where(
        _history.c.scope_id == SCOPE_ID,
        _history.c.revision == select(_scopes.c.revision).where(SCOPE_MATCH).scalar_subquery(),
        _history.c.entity == "fact",
        _history.c.entity_id == bindparam("b_fact_id"),
        _history.c.action == "delete",
    )
    .scalar_subquery()
)
ANNOTATE_DELETION = (
    update(_history)
    .where(_history.c.id == _LATEST_DELETION, _history.c.detail.is_(None))
    .values(detail=bindparam("b_detail", type_=_NULLABLE_JSON))
)
# A re-stated fact: a retention signal, not a content change (no revision, no audit row).
CONFIRM_FACTS = (
    update(_facts)
    .where(
        _facts.c.scope_id == bindparam("b_scope_id"),
        _facts.c.fact_id.in_(bindparam("b_fact_ids", expanding=True)),
        _facts.c.deleted_revision.is_(None),
    )
    .values(last_confirmed_at=bindparam("b_now", type_=_facts.c.last_confirmed_at.type))
)


def _insert_scope(dialect: Any) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING: concurrent first saves of a scope create one row."""
    return (
        dialect.insert(_scopes)
        .values(
            tenant_id=bindparam("tenant_id"),
            user_id=bindparam("user_id"),
            agent_name=bindparam("agent_name"),
            revision=0,
            created_at=bindparam("now", type_=_scopes.c.created_at.type),
            updated_at=bindparam("now", type_=_scopes.c.updated_at.type),
        )
        .on_conflict_do_nothing()
    )


INSERT_SCOPE = {"sqlite": _insert_scope(sqlite), "postgresql": _insert_scope(postgresql)}


def scope_keys(scope: Scope, tenant_id: str) -> dict[str, str]:
    """Bind parameters of the scope predicate: ``''`` stands for NULL, as in the unique index."""
    return {"tenant_key": tenant_id, "user_key": scope[0] or "", "agent_key": scope[1] or ""}


def tenant_is(tenant_id: str) -> ColumnElement[bool]:
    """``memory_scopes.tenant_id = tenant_id``: every read across scopes stays inside one tenant."""
    return _scopes.c.tenant_id == tenant_id


# A shared fact's grants, written after its row (``write.write_grants``): replaced as a whole.
_FACT_ROW_ID = (
    select(_facts.c.id)
    .where(_facts.c.scope_id == bindparam("b_scope_id"), _facts.c.fact_id == bindparam("b_fact_id"))
    .scalar_subquery()
)
DELETE_GRANTS = delete(_grants).where(
    _grants.c.scope_id == bindparam("b_scope_id"), _grants.c.fact_row_id == _FACT_ROW_ID
)
INSERT_GRANT = insert(_grants).values(
    fact_row_id=_FACT_ROW_ID,
    grantee_kind=bindparam("b_kind"),
    grantee=bindparam("b_grantee"),
    scope_id=bindparam("b_scope_id"),
    tenant_id=bindparam("b_tenant_id"),
)
# A fact's tags and its relations, replaced as a whole when a save writes the fact (``write.write_links``).
DELETE_TAGS = delete(_tags).where(
    _tags.c.scope_id == bindparam("b_scope_id"), _tags.c.fact_row_id == _FACT_ROW_ID
)
INSERT_TAG = insert(_tags).values(
    fact_row_id=_FACT_ROW_ID,
    tag=bindparam("b_tag"),
    scope_id=bindparam("b_scope_id"),
    tenant_id=bindparam("b_tenant_id"),
)
TAGS_QUERY = (
    select(_facts.c.fact_id, _tags.c.tag)
    .join(_facts, and_(_facts.c.scope_id == _tags.c.scope_id, _facts.c.id == _tags.c.fact_row_id))
    .where(_tags.c.scope_id == bindparam("scope_id"))
)
DELETE_RELATIONS = delete(_relations).where(
    _relations.c.scope_id == bindparam("b_scope_id"), _relations.c.fact_id == bindparam("b_fact_id")
)
DELETE_OUTGOING = delete(_relations).where(
    _relations.c.scope_id == bindparam("b_scope_id"),
    _relations.c.fact_id.in_(bindparam("b_fact_ids", expanding=True)),
)
DELETE_TOMBSTONED_TAGS = delete(_tags).where(
    _tags.c.scope_id == bindparam("b_scope_id"),
    _tags.c.fact_row_id.in_(
        select(_facts.c.id).where(
            _facts.c.scope_id == bindparam("b_scope_id"),
            _facts.c.fact_id.in_(bindparam("b_fact_ids", expanding=True)),
        )
    ),
)
# Only a target the scope holds (live or tombstoned): the foreign key would refuse any other.
INSERT_RELATION = (
    insert(_relations)
    .from_select(
        ["scope_id", "fact_id", "kind", "target_fact_id", "tenant_id"],
        select(
            bindparam("b_scope_id", type_=_relations.c.scope_id.type),
            bindparam("b_fact_id", type_=_relations.c.fact_id.type),
            bindparam("b_kind", type_=_relations.c.kind.type),
            _facts.c.fact_id,
            bindparam("b_tenant_id", type_=_relations.c.tenant_id.type),
        ).where(_facts.c.scope_id == bindparam("b_scope_id"), _facts.c.fact_id == bindparam("b_target")),
    )
    .returning(_relations.c.kind)
)
# Which of some fact ids the scope holds, live or deleted: the targets a relation may name.
STORED_IDS = select(_facts.c.fact_id).where(
    _facts.c.scope_id == bindparam("scope_id"), _facts.c.fact_id.in_(bindparam("fact_ids", expanding=True))
)
RELATIONS_QUERY = select(_relations.c.fact_id, _relations.c.kind, _relations.c.target_fact_id).where(
    _relations.c.scope_id == bindparam("scope_id")
)
GRANTS_QUERY = (
    select(_facts.c.fact_id, _grants.c.grantee_kind, _grants.c.grantee)
    .join(_facts, and_(_facts.c.scope_id == _grants.c.scope_id, _facts.c.id == _grants.c.fact_row_id))
    .where(_grants.c.scope_id == bindparam("scope_id"))
)
