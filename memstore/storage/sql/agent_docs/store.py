"""``AgentDocStore``: the agent's documents and their versions in the memory database.

Every call runs as one identity (``scoped.py``): on PostgreSQL the row-level security of
``memory_agent_documents`` holds it to the tenant's agent documents and the user's own. A write
is one transaction that locks the scope first (PostgreSQL: a transaction advisory lock on
``(tenant, agent, user)``; SQLite: ``BEGIN IMMEDIATE``), so the per-scope caps hold between
concurrent writers, then checks the version the caller read against the stored one: a writer
that read an older version gets ``AgentDocConflictError`` and nothing is stored, never a silent
overwrite of the other writer's text.

On PostgreSQL a write also holds its agent's lock shared and a lock on each user it writes for
or as, which an erase of the agent or of the user takes exclusively first: an erase waits for
the writes in flight and removes what they wrote, instead of deleting around them and leaving a
version (a user's text, or its name) behind.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, and_, delete, func, insert, select, update

from memstore.agent_doc import (
    AgentDocument,
    DocAgentSummary,
    DocLimits,
    DocScope,
    DocVersion,
    checked_content,
    checked_path,
)
from memstore.document import as_utc
from memstore.errors import (
    AgentDocConflictError,
    AgentDocLimitError,
    AgentDocNotFoundError,
    StorageUnavailableError,
)
from memstore.scope import Identity
from memstore.storage.sql.maintenance.operator import operator_engine
from memstore.storage.sql.schema.models import agent_document_versions_table as _versions
from memstore.storage.sql.schema.models import agent_documents_table as _documents
from memstore.storage.sql.scoped import ScopedConnections

NO_ID = ""
"""``agent_name`` of the unnamed agent and ``user_id`` of the agent's own documents."""
Change = Callable[[str | None], object]
"""From the live text (``None``: no live document) to the new text (checked after); raises to refuse."""


def scope_values(scope: DocScope) -> dict[str, str]:
    return {
        "tenant_id": scope.tenant_id,
        "agent_name": scope.agent_name or NO_ID,
        "user_id": scope.user_id or NO_ID,
    }


def _in_scope(table: Any, scope: DocScope) -> Any:
    return and_(*(table.c[name] == value for name, value in scope_values(scope).items()))


def _at(table: Any, scope: DocScope, path: str) -> Any:
    return and_(_in_scope(table, scope), table.c.path == path)


class AgentDocStore:
    def __init__(self, database_url: str) -> None:
        self._db = ScopedConnections(database_url, StorageUnavailableError, "agent documents")

    @staticmethod
    def _identity(scope: DocScope, actor: str | None) -> Identity:
        # A user's documents are theirs; the agent's own are written for whichever user it serves.
        return Identity.of(scope.user_id or actor, tenant_id=scope.tenant_id)

    def list_documents(
        self, scope: DocScope, folder: str, *, actor: str | None = None
    ) -> list[AgentDocument]:
        """The live documents under ``folder`` (a ``/memories/.../`` prefix), by path, without text.

        The prefix is compared as it is, not with ``LIKE``, which SQLite matches ignoring case,
        and the paths are sorted here, by code point, whatever the database's collation."""
        with self._db.read(self._identity(scope, actor)) as conn:
            rows = conn.execute(
                select(*_META).where(
                    _in_scope(_documents, scope),
                    _documents.c.deleted_at.is_(None),
                    func.substr(_documents.c.path, 1, len(folder)) == folder,
                )
            ).all()
        return sorted((_document(row) for row in rows), key=lambda doc: doc.path)

    def read(self, scope: DocScope, path: object, *, actor: str | None = None) -> AgentDocument:
        path = checked_path(path)
        with self._db.read(self._identity(scope, actor)) as conn:
            row = conn.execute(
                select(*_META, _documents.c.content).where(
                    _at(_documents, scope, path), _documents.c.deleted_at.is_(None)
                )
            ).first()
        if row is None:
            raise AgentDocNotFoundError(path)
        return _document(row, row.content)

    def change(
        self,
        scope: DocScope,
        path: object,
        change: Change,
        *,
        action: str,
        expected_version: int | None,
        author: str,
        actor: str | None,
        limits: DocLimits,
        now: datetime,
    ) -> AgentDocument:
        """Store ``change(live text)`` at ``path`` as its next version (``action`` ``write`` or
        ``edit``). ``expected_version``: ``None`` takes whatever is stored, ``0`` requires that no
        live document is there, ``n`` that version ``n`` is; otherwise ``AgentDocConflictError``."""
        path = checked_path(path)
        with self._db.write(self._identity(scope, actor), action) as conn:
            row = self._locked(conn, scope, path, actor)
            live = _live_version(row)
            _check_version(path, expected_version, live)
            live_text = row.content if row is not None and live else None
            content = checked_content(change(live_text), max_chars=limits.max_doc_chars)
            _check_caps(conn, scope, path, adding=not live, chars=len(content), limits=limits)
            if row is None:
                _make_room(conn, scope, limits)
            version = (row.version if row is not None else 0) + 1
            values = {
                "content": content,
                "chars": len(content),
                "version": version,
                "author": author,
                "actor": actor,
                "updated_at": now,
                "deleted_at": None,
            }
            if row is None:
                conn.execute(
                    insert(_documents).values(**scope_values(scope), path=path, created_at=now, **values)
                )
            else:
                conn.execute(update(_documents).where(_at(_documents, scope, path)).values(**values))
            _record(conn, scope, path, version, action, author, actor, content, now, limits)
        return AgentDocument(path, version, len(content), author, actor, now, content)

    def delete(
        self,
        scope: DocScope,
        path: object,
        *,
        expected_version: int | None,
        author: str,
        actor: str | None,
        limits: DocLimits,
        now: datetime,
    ) -> int:
        """Delete the live document at ``path``; returns the version the delete recorded."""
        path = checked_path(path)
        with self._db.write(self._identity(scope, actor), "delete") as conn:
            row = self._locked(conn, scope, path, actor)
            live = _live_version(row)
            if row is None or not live:
                raise AgentDocNotFoundError(path)
            _check_version(path, expected_version, live)
            version = row.version + 1
            conn.execute(
                update(_documents)
                .where(_at(_documents, scope, path))
                .values(
                    content="",
                    chars=0,
                    version=version,
                    author=author,
                    actor=actor,
                    updated_at=now,
                    deleted_at=now,
                )
            )
            _record(conn, scope, path, version, "delete", author, actor, None, now, limits)
        return int(version)

    def history(
        self,
        scope: DocScope,
        path: object | None,
        *,
        limit: int = 50,
        offset: int = 0,
        version: int | None = None,
        actor: str | None = None,
    ) -> list[DocVersion]:
        """The versions of ``path`` (only ``version``, when given), or of every document of the
        scope, newest first: by version for one document (a writer that waited for the lock may
        carry an earlier time than the version before it), by time across documents."""
        where = [_in_scope(_versions, scope)]
        order = [_versions.c.created_at.desc(), _versions.c.path, _versions.c.version.desc()]
        if path is not None:
            where.append(_versions.c.path == checked_path(path))
            order = [_versions.c.version.desc()]
        if version is not None:
            where.append(_versions.c.version == version)
        with self._db.read(self._identity(scope, actor)) as conn:
            rows = conn.execute(
                select(_versions).where(*where).order_by(*order).limit(limit).offset(offset)
            ).all()
        return [
            DocVersion(
                row.path,
                int(row.version),
                row.action,
                row.author,
                row.actor,
                as_utc(row.created_at),
                row.content,
            )
            for row in rows
        ]

    def summaries(self, tenant_id: str | None) -> list[DocAgentSummary]:
        """Every scope holding live documents (in ``tenant_id``, or every tenant), on the operator
        connection: an operator's listing crosses users and agents."""
        engine = operator_engine(self._db.engine, "list agent documents")
        live = _documents.c.deleted_at.is_(None)
        where = [live] if tenant_id is None else [live, _documents.c.tenant_id == tenant_id]
        keys = (_documents.c.tenant_id, _documents.c.agent_name, _documents.c.user_id)
        with self._db.guard("list"), engine.connect() as conn:
            rows = conn.execute(
                select(*keys, func.count(), func.sum(_documents.c.chars), func.max(_documents.c.updated_at))
                .where(*where)
                .group_by(*keys)
                .order_by(*keys)
            ).all()
        return [
            DocAgentSummary(row[0], row[1] or None, row[2] or None, int(row[3]), int(row[4]), as_utc(row[5]))
            for row in rows
        ]

    def erase_agent(self, tenant_id: str, agent_name: str | None) -> dict[str, int]:
        """Delete every document of the agent in the tenant (its users' too) and their history,
        on the operator connection; returns the rows deleted per table."""
        engine = operator_engine(self._db.engine, "erase an agent's documents")
        agent = agent_name or NO_ID
        with self._db.guard("erase"), engine.connect() as conn:
            conn.execution_options(**self._db.write_options)
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(select(func.pg_advisory_xact_lock(_lock_key("agent", tenant_id, agent))))
                return {
                    table.name: int(
                        conn.execute(
                            delete(table).where(table.c.tenant_id == tenant_id, table.c.agent_name == agent)
                        ).rowcount
                    )
                    for table in (_versions, _documents)
                }

    @staticmethod
    def _locked(conn: Connection, scope: DocScope, path: str, actor: str | None) -> Row[Any] | None:
        if conn.dialect.name == "postgresql":
            # In one round trip, always in this order (agent, scope, users by name): no two
            # writers wait for each other's locks.
            values = scope_values(scope)
            tenant, agent = values["tenant_id"], values["agent_name"]
            users = sorted({name for name in (scope.user_id, actor) if name is not None})
            conn.execute(
                select(
                    func.pg_advisory_xact_lock_shared(_lock_key("agent", tenant, agent)),
                    func.pg_advisory_xact_lock(_lock_key("scope", tenant, agent, values["user_id"])),
                    *(func.pg_advisory_xact_lock(_lock_key("user", tenant, name)) for name in users),
                )
            )
        return conn.execute(select(_documents).where(_at(_documents, scope, path)).with_for_update()).first()


def _lock_key(kind: str, *names: str) -> Any:
    """A transaction advisory lock's key; ``/`` is in no id or agent name, so keys never mix."""
    return func.hashtextextended("/".join(("agent-doc", kind, *names)), 0)


def erase_user_documents(conn: Connection, tenant_id: str, user_id: str) -> dict[str, int]:
    """In the erase's transaction: the user's own documents and their versions go, and the
    user's name is taken out of the versions of the agents' own documents it wrote. Waits first
    for the writes in flight for or as the user (PostgreSQL), so none outlives the erase."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_advisory_xact_lock(_lock_key("user", tenant_id, user_id))))
    counts = {
        table.name: int(
            conn.execute(
                delete(table).where(table.c.tenant_id == tenant_id, table.c.user_id == user_id)
            ).rowcount
        )
        for table in (_versions, _documents)
    }
    for table in (_versions, _documents):
        conn.execute(
            update(table).where(table.c.tenant_id == tenant_id, table.c.actor == user_id).values(actor=None)
        )
    return counts


_META = [_documents.c[name] for name in ("path", "version", "chars", "author", "actor", "updated_at")]


def _document(row: Any, content: str | None = None) -> AgentDocument:
    return AgentDocument(
        row.path, int(row.version), int(row.chars), row.author, row.actor, as_utc(row.updated_at), content
    )


def _live_version(row: Row[Any] | None) -> int:
    return 0 if row is None or row.deleted_at is not None else int(row.version)


def _check_version(path: str, expected: int | None, live: int) -> None:
    if expected is not None and expected != live:
        raise AgentDocConflictError(path, expected=expected, current=live)


def _check_caps(
    conn: Connection, scope: DocScope, path: str, *, adding: bool, chars: int, limits: DocLimits
) -> None:
    count, total = conn.execute(
        select(func.count(), func.coalesce(func.sum(_documents.c.chars), 0)).where(
            _in_scope(_documents, scope), _documents.c.deleted_at.is_(None), _documents.c.path != path
        )
    ).one()
    if adding and count + 1 > limits.max_docs:
        raise AgentDocLimitError(
            f"{scope.label} already has {count} documents, the most allowed (agent_doc_max_docs); "
            "delete one or add to an existing one"
        )
    if total + chars > limits.max_total_chars:
        raise AgentDocLimitError(
            f"{scope.label}'s documents would hold {total + chars} characters, over the "
            f"{limits.max_total_chars} allowed (agent_doc_max_total_chars)"
        )


def _make_room(conn: Connection, scope: DocScope, limits: DocLimits) -> None:
    """Before a new path's first row: a deleted document keeps its row and history, so once the
    scope holds ``2 × agent_doc_max_docs`` rows the longest-deleted one goes, history and all.
    Storage stays bounded (rows, and ``agent_doc_history_keep`` versions each) however many
    documents are created and deleted; a writer still holding a purged version gets a conflict."""
    rows = conn.execute(
        select(func.count()).select_from(_documents).where(_in_scope(_documents, scope))
    ).scalar_one()
    if rows < 2 * limits.max_docs:
        return
    oldest = conn.execute(
        select(_documents.c.path)
        .where(_in_scope(_documents, scope), _documents.c.deleted_at.is_not(None))
        .order_by(_documents.c.deleted_at, _documents.c.path)
        .limit(1)
    ).scalar_one_or_none()
    if oldest is not None:  # none: every row is live, and the live cap has refused already
        conn.execute(delete(_versions).where(_at(_versions, scope, oldest)))
        conn.execute(delete(_documents).where(_at(_documents, scope, oldest)))


def _record(
    conn: Connection,
    scope: DocScope,
    path: str,
    version: int,
    action: str,
    author: str,
    actor: str | None,
    content: str | None,
    now: datetime,
    limits: DocLimits,
) -> None:
    conn.execute(
        insert(_versions).values(
            **scope_values(scope),
            path=path,
            version=version,
            action=action,
            author=author,
            actor=actor,
            content=content,
            created_at=now,
        )
    )
    conn.execute(
        delete(_versions).where(
            _at(_versions, scope, path), _versions.c.version <= version - limits.history_keep
        )
    )
