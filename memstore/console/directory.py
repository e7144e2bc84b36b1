"""The console's tenant and user lists: one page of users with their counts, straight from SQL.

``memstore.queries`` lists scopes whole (``list_scopes``), which a tenant of 100,000 users turns
into 100,000 rows per page view. These read only the page: users grouped from ``memory_scopes``
(one row per user and agent, on the ``(tenant_id, user_id, agent_name)`` index), then the live
facts of just the page's users. They cross users, so they run on the operator connection
(``operator_database_url`` under row-level security), as ``memstore stats`` does. The scopes
holding agent documents are paged the same way (``doc_scopes``): with ``agent_doc_per_user`` a
tenant of 100,000 users has as many, which ``AgentDocStore.summaries`` would return whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Engine, func, literal_column, select

from memstore.document import as_utc
from memstore.errors import ConfigError
from memstore.storage.base import MemoryStorage
from memstore.storage.records import iso
from memstore.storage.sql import SqlMemoryStorage
from memstore.storage.sql.maintenance.operator import operator_engine
from memstore.storage.sql.schema.models import agent_documents_table as _docs
from memstore.storage.sql.schema.models import facts_table as _facts
from memstore.storage.sql.schema.models import scopes_table as _scopes

UserOrder = Literal["id", "recent"]
USER_ORDERS: tuple[UserOrder, ...] = ("id", "recent")
MAX_USER_PAGE = 200


def directory_engine(storage: MemoryStorage, work: str = "the console's tenant and user lists") -> Engine:
    """The engine that reads across users: the SQL provider's, on the operator connection."""
    if not isinstance(storage, SqlMemoryStorage):
        raise ConfigError(f"the console needs the SQL provider; storage_class is {type(storage).__name__}")
    return operator_engine(storage.engine, work)


@dataclass(frozen=True)
class TenantRow:
    tenant_id: str
    users: int
    scopes: int
    last_activity: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "users": self.users,
            "scopes": self.scopes,
            "last_activity": iso(self.last_activity),
        }


@dataclass(frozen=True)
class UserRow:
    user_id: str
    agents: int
    facts: int
    last_activity: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "agents": self.agents,
            "facts": self.facts,
            "last_activity": iso(self.last_activity),
        }


@dataclass(frozen=True)
class UserPage:
    users: list[UserRow]
    total: int
    limit: int
    offset: int

    def to_json(self) -> dict[str, Any]:
        following = self.offset + len(self.users)
        return {
            "users": [user.to_json() for user in self.users],
            "total": self.total,
            "limit": self.limit,
            "offset": self.offset,
            "next_offset": following if following < self.total else None,
        }


def tenants(engine: Engine, only: str | None = None) -> list[TenantRow]:
    """Every tenant holding a scope (or just ``only``), with its users, scopes and last change."""
    query = select(
        _scopes.c.tenant_id,
        func.count(_scopes.c.user_id.distinct()),
        func.count(),
        func.max(_scopes.c.updated_at),
    ).group_by(_scopes.c.tenant_id)
    if only is not None:
        query = query.where(_scopes.c.tenant_id == only)
    with engine.connect() as conn:
        rows = conn.execute(query.order_by(_scopes.c.tenant_id)).all()
    return [TenantRow(tenant, users, scopes, as_utc(last)) for tenant, users, scopes, last in rows]


def users(
    engine: Engine,
    tenant_id: str,
    *,
    search: str | None = None,
    order: UserOrder = "id",
    limit: int = 50,
    offset: int = 0,
) -> UserPage:
    """One page of the tenant's users (``search``: ids containing it), by id or most recent change
    first, each with its agents, live facts and last change; ``total`` counts every match."""
    # The unique index's own expression: the index then serves the grouping, the order and the
    # count, so a page of a tenant with 100,000 users reads about one page of index entries (a
    # deep offset walks the entries before it), and the total is one scan of the tenant's entries.
    user = func.coalesce(_scopes.c.user_id, literal_column("''"))
    conditions = [_scopes.c.tenant_id == tenant_id, user > literal_column("''")]
    if search:
        conditions.append(user.icontains(search, autoescape=True))
    last = func.max(_scopes.c.updated_at)
    grouped = (
        select(user.label("user_id"), func.count().label("agents"), last.label("last_activity"))
        .where(*conditions)
        .group_by(user)
    )
    ordering = (user,) if order == "id" else (last.desc(), user)
    with engine.connect() as conn:
        matching = select(user).where(*conditions).group_by(user).subquery()
        total = conn.execute(select(func.count()).select_from(matching)).scalar_one()
        rows = conn.execute(grouped.order_by(*ordering).limit(limit).offset(offset)).all()
        ids = [row.user_id for row in rows]
        counted = (
            select(user, func.count(_facts.c.id))
            .select_from(_facts.join(_scopes, _scopes.c.id == _facts.c.scope_id))
            .where(_scopes.c.tenant_id == tenant_id, user.in_(ids), _facts.c.deleted_revision.is_(None))
            .group_by(user)
        )
        facts: dict[str, int] = {owner: count for owner, count in conn.execute(counted)} if ids else {}
    page = [
        UserRow(row.user_id, int(row.agents), int(facts.get(row.user_id, 0)), as_utc(row.last_activity))
        for row in rows
    ]
    return UserPage(page, int(total), limit, offset)


def doc_scopes(
    engine: Engine, tenant_id: str, *, user_id: str | None = None, limit: int = 50, offset: int = 0
) -> dict[str, Any]:
    """One page of the tenant's scopes holding live agent documents (``user_id``: that user's
    only), most recently changed first, each with its documents, characters and last change."""
    conditions = [_docs.c.tenant_id == tenant_id, _docs.c.deleted_at.is_(None)]
    if user_id is not None:
        conditions.append(_docs.c.user_id == user_id)
    keys = (_docs.c.agent_name, _docs.c.user_id)
    last = func.max(_docs.c.updated_at)
    grouped = select(*keys, func.count(), func.sum(_docs.c.chars), last).where(*conditions).group_by(*keys)
    with engine.connect() as conn:
        matching = select(*keys).where(*conditions).group_by(*keys).subquery()
        total = int(conn.execute(select(func.count()).select_from(matching)).scalar_one())
        rows = conn.execute(grouped.order_by(last.desc(), *keys).limit(limit).offset(offset)).all()
    following = offset + len(rows)
    return {
        "scopes": [
            {
                "agent_name": agent or None,
                "user_id": user or None,
                "documents": int(documents),
                "chars": int(chars or 0),
                "updatedAt": iso(as_utc(updated)),
            }
            for agent, user, documents, chars, updated in rows
        ],
        "total": total,
        "limit": limit,
        "offset": offset,
        "next_offset": following if following < total else None,
    }
