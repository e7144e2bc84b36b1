"""The console's JSON about memory: tenants and users, one user's memory and facts, a fact's
history, the ``<memory>`` block, and the fact edits (``PATCH``/``DELETE``, CSRF-checked).

Every handler is a plain ``def`` (FastAPI runs it on its thread pool) over the sync operations
the CLI uses: ``memstore.ops.queries`` pages and filters in SQL, ``memstore.ops.facts`` edits with
its checks and merge-safe saves. An edit acts as the fact's owner with the operator's roles and
is audited with origin ``console:<operator>`` (``history.console_origin``). It names the version
of the fact the operator looked at, and a fact changed since then is a 409, not overwritten.
"""

# No ``from __future__ import annotations``: FastAPI evaluates the handlers' annotations.

from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from memstore.console.directory import MAX_USER_PAGE, USER_ORDERS, directory_engine, tenants, users
from memstore.console.errors import console_errors
from memstore.console.history import console_origin, version_json
from memstore.console.inputs import Offset
from memstore.console.preview import memory_block
from memstore.console.security import Operator, check_mutation
from memstore.document import (
    HISTORY_SECTIONS,
    MAX_CATEGORY_CHARS,
    MAX_FACT_CHARS,
    USER_SECTIONS,
)
from memstore.inject.relevance import MAX_QUERY_CHARS
from memstore.integrations.fastapi_errors import MemoryRoute
from memstore.ops.facts import delete_memory_fact, update_memory_fact
from memstore.ops.queries import list_facts, list_scopes, memory_history
from memstore.record import MEMORY_TYPES
from memstore.scope import validate_user_id
from memstore.storage.loader import get_memory_storage
from memstore.storage.records import ANY_AGENT, FACT_ORDERS, MAX_PAGE_SIZE, AgentFilter, FactFilter

MAX_HISTORY = 1000


class FactEdit(BaseModel):
    """The fields an operator may change; the others (``createdAt``, ``source``, ...) are kept."""

    model_config = ConfigDict(extra="forbid")

    content: str | None = Field(default=None, min_length=1, max_length=MAX_FACT_CHARS)
    category: str | None = Field(default=None, min_length=1, max_length=MAX_CATEGORY_CHARS)
    confidence: float | None = Field(default=None, ge=0, le=1)
    importance: float | None = Field(default=None, ge=0, le=1)
    memory_type: str | None = None
    tags: list[str] | None = None
    visibility: Literal["private", "shared", "public"] | None = None
    version: int | None = Field(default=None, ge=1)
    """The fact's version the operator edited (the listing's ``version``): a 409 if it moved on."""


NO_AGENT = "_"
"""The agent parameter's value for the scope without an agent (never a valid agent name)."""


def agent_filter(agent: str | None) -> AgentFilter:
    """``agent`` as a list filter: absent is every agent, ``_`` the scope without one."""
    return ANY_AGENT if not agent else exact_agent(agent)


def exact_agent(agent: str | None) -> str | None:
    """``agent`` for a route on one scope: absent or ``_`` is the scope without an agent."""
    return None if not agent or agent == NO_AGENT else agent


def _user(user_id: str) -> str:
    checked = validate_user_id(user_id)
    assert checked is not None
    return checked


def _still_at(user: str, agent: str | None, tenant_id: str, fact_id: str, version: int | None) -> None:
    """Refuse (409) to change a fact that moved past ``version`` since the operator looked at it.

    The edit itself then merges its change against the document it loads (a writer racing *that*
    is ``ops.facts``' ``FactEditConflictError``); this covers the minutes the operator spent on the
    page, which the merge cannot see. A fact gone meanwhile is left to the edit's own 404.
    """
    if version is None:
        return
    where = FactFilter(user_id=user, agent_name=agent, fact_id=fact_id)
    held = next((fact for fact in list_facts(where, tenant_id=tenant_id).facts if fact.user_id == user), None)
    if held is not None and held.version != version:
        raise HTTPException(
            409,
            f"fact {fact_id} changed since you opened it (version {version}, now {held.version}): "
            "reload the page and look again",
        )


def memory_router(operator: Callable[..., Operator]) -> APIRouter:
    router = APIRouter(route_class=MemoryRoute)
    caller = Depends(operator)

    @router.get("/tenants")
    def list_tenants(me: Operator = caller) -> dict[str, Any]:
        with console_errors(me):
            engine = directory_engine(get_memory_storage())
            rows = tenants(engine, None if me.crosses_tenants else me.tenant_id)
        return {"tenants": [row.to_json() for row in rows]}

    @router.get("/users")
    def list_users(
        me: Operator = caller,
        tenant: str | None = None,
        q: str | None = Query(default=None, max_length=128),
        order: str = "id",
        limit: int = Query(default=50, ge=1, le=MAX_USER_PAGE),
        offset: Offset = 0,
    ) -> dict[str, Any]:
        if order not in USER_ORDERS:
            raise HTTPException(422, f"order must be one of {', '.join(USER_ORDERS)}")
        with console_errors(me):
            engine = directory_engine(get_memory_storage())
            page = users(engine, me.tenant(tenant), search=q or None, order=order, limit=limit, offset=offset)
        return page.to_json()

    @router.get("/users/{user_id}/memory")
    def user_memory(
        user_id: str, me: Operator = caller, tenant: str | None = None, agent: str | None = None
    ) -> dict[str, Any]:
        with console_errors(me):
            tenant_id, user = me.tenant(tenant), _user(user_id)
            storage = get_memory_storage().for_identity(tenant_id)
            document = storage.load(exact_agent(agent), user_id=user)
            scopes = list_scopes(user, tenant_id=tenant_id)
        sections = []
        for group, names in (("user", USER_SECTIONS), ("history", HISTORY_SECTIONS)):
            held = document.get(group)
            for name in names:
                section = held.get(name) if isinstance(held, dict) else None
                if isinstance(section, dict):
                    sections.append(
                        {
                            "group": group,
                            "name": name,
                            "summary": section.get("summary", ""),
                            "updatedAt": section.get("updatedAt"),
                        }
                    )
        return {
            "user_id": user,
            "tenant_id": tenant_id,
            "agent": exact_agent(agent),
            "agents": [scope_agent for _, scope_agent in scopes],
            "sections": sections,
            "facts": len(document.get("facts") or []),
            "lastUpdated": document.get("lastUpdated"),
            "revision": document.get("revision"),
        }

    @router.get("/users/{user_id}/facts")
    def user_facts(
        user_id: str,
        me: Operator = caller,
        tenant: str | None = None,
        agent: str | None = None,
        category: str | None = Query(default=None, max_length=MAX_CATEGORY_CHARS),
        memory_type: str | None = None,
        visibility: str | None = None,
        min_confidence: float | None = Query(default=None, ge=0, le=1),
        min_importance: float | None = Query(default=None, ge=0, le=1),
        tag: str | None = Query(default=None, max_length=64),
        text: str | None = Query(default=None, max_length=MAX_FACT_CHARS),
        order: str = "newest",
        limit: int = Query(default=50, ge=1, le=MAX_PAGE_SIZE),
        offset: Offset = 0,
    ) -> dict[str, Any]:
        if memory_type is not None and memory_type not in MEMORY_TYPES:
            raise HTTPException(422, f"memory_type must be one of {', '.join(MEMORY_TYPES)}")
        if order not in FACT_ORDERS:
            raise HTTPException(422, f"order must be one of {', '.join(FACT_ORDERS)}")
        with console_errors(me):
            where = FactFilter(
                user_id=_user(user_id),
                agent_name=agent_filter(agent),
                category=category or None,
                memory_type=memory_type or None,
                visibility=visibility or None,
                min_confidence=min_confidence,
                min_importance=min_importance,
                tag=tag or None,
                text=text or None,
            )
            page = list_facts(where, limit=limit, offset=offset, order=order, tenant_id=me.tenant(tenant))
        return page.to_json()

    @router.patch("/users/{user_id}/facts/{fact_id}", dependencies=[Depends(check_mutation)])
    def edit_fact(
        user_id: str,
        fact_id: str,
        edit: FactEdit,
        me: Operator = caller,
        tenant: str | None = None,
        agent: str | None = None,
    ) -> dict[str, Any]:
        if edit.memory_type is not None and edit.memory_type not in MEMORY_TYPES:
            raise HTTPException(422, f"memory_type must be one of {', '.join(MEMORY_TYPES)}")
        with console_errors(me):
            user, tenant_id = _user(user_id), me.tenant(tenant)
            _still_at(user, exact_agent(agent), tenant_id, fact_id, edit.version)
            stored = update_memory_fact(
                fact_id,
                edit.content,
                edit.category,
                edit.confidence,
                exact_agent(agent),
                user_id=user,
                tenant_id=tenant_id,
                roles=me.roles,
                visibility=edit.visibility,
                memory_type=edit.memory_type,
                importance=edit.importance,
                tags=edit.tags,
                origin=console_origin(me.user_id),
            )
        held = next((fact for fact in stored.get("facts") or [] if fact.get("id") == fact_id), None)
        return {"fact": held}

    @router.delete("/users/{user_id}/facts/{fact_id}", dependencies=[Depends(check_mutation)])
    def delete_fact(
        user_id: str,
        fact_id: str,
        me: Operator = caller,
        tenant: str | None = None,
        agent: str | None = None,
        version: int | None = Query(default=None, ge=1),
    ) -> dict[str, Any]:
        with console_errors(me):
            user, tenant_id = _user(user_id), me.tenant(tenant)
            _still_at(user, exact_agent(agent), tenant_id, fact_id, version)
            delete_memory_fact(
                fact_id,
                exact_agent(agent),
                user_id=user,
                tenant_id=tenant_id,
                roles=me.roles,
                origin=console_origin(me.user_id),
            )
        return {"deleted": fact_id}

    @router.get("/users/{user_id}/facts/{fact_id}/history")
    def fact_history(
        user_id: str, fact_id: str, me: Operator = caller, tenant: str | None = None, agent: str | None = None
    ) -> dict[str, Any]:
        with console_errors(me):
            tenant_id, user = me.tenant(tenant), _user(user_id)
            where = FactFilter(user_id=user, agent_name=exact_agent(agent), fact_id=fact_id)
            entries = memory_history(where, fact_id=fact_id, limit=MAX_HISTORY, tenant_id=tenant_id)
            current = list_facts(where, limit=1, tenant_id=tenant_id).facts
        live = next((record.to_json() for record in current if record.user_id == user), None)
        return {
            "fact_id": fact_id,
            "user_id": user,
            "current": live,
            "versions": [version_json(entry) for entry in entries],
        }

    @router.get("/users/{user_id}/context")
    def context(
        user_id: str,
        me: Operator = caller,
        tenant: str | None = None,
        agent: str | None = None,
        query: str | None = Query(default=None, max_length=MAX_QUERY_CHARS),
    ) -> dict[str, Any]:
        with console_errors(me):
            preview = memory_block(_user(user_id), exact_agent(agent), me.tenant(tenant), query, frozenset())
        return preview.to_json()

    return router
