"""The console's remaining JSON: who the caller is and what the deployment offers, search across
users, a user's sessions, and the agents' documents.

Search is ``memstore.ops.queries.search_facts`` (the operator's search: it counts as no access);
sessions and documents are ``memstore.ops.sessions`` and ``memstore.ops.agent_docs``, the CLI's,
except the list of scopes holding documents, paged in SQL (``directory.doc_scopes``).
"""

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query

from memstore.agent_doc import DocScope
from memstore.config import get_memory_config
from memstore.console.directory import directory_engine, doc_scopes
from memstore.console.errors import console_errors
from memstore.console.inputs import Offset
from memstore.console.memory_routes import exact_agent
from memstore.console.security import Operator
from memstore.document import FACT_CATEGORIES, MAX_FACT_CHARS
from memstore.integrations.fastapi_errors import MemoryRoute
from memstore.ops.agent_docs import (
    MAX_HISTORY_LIMIT,
    doc_history,
    document_fields,
    list_docs,
    read_doc,
    version_fields,
)
from memstore.ops.queries import search_facts
from memstore.ops.sessions import MAX_LIST_LIMIT, info_dict, list_sessions, read_session, turn_dict
from memstore.scope import validate_user_id
from memstore.storage.loader import get_memory_storage
from memstore.storage.records import SEARCH_MODES, FactFilter
from memstore.storage.search_text import SEARCH_MATCHES
from memstore.storage.sessions.loader import session_backend

MAX_SEARCH_PAGE = 100
MAX_DOC_SCOPES = 200
"""Document scopes on one page at most (the newest first); a user's own are on their page."""


def more_router(operator: Callable[..., Operator]) -> APIRouter:
    router = APIRouter(route_class=MemoryRoute)
    caller = Depends(operator)

    @router.get("/me")
    def me(me: Operator = caller) -> dict[str, Any]:
        config = get_memory_config()
        return {
            "user_id": me.user_id,
            "tenant_id": me.tenant_id,
            "roles": sorted(me.roles),
            "crosses_tenants": me.crosses_tenants,
            "semantic_search": config.embedding_provider != "none",
            "expire_below": config.expire_below,
            "max_facts": config.max_facts,
            "session_backend": session_backend(config),
            "agent_doc_per_user": config.agent_doc_per_user,
            "categories": list(FACT_CATEGORIES),
        }

    @router.get("/search")
    def search(
        me: Operator = caller,
        q: str = Query(min_length=1, max_length=MAX_FACT_CHARS),
        tenant: str | None = None,
        mode: str = "fulltext",
        match: str | None = None,
        user: str | None = Query(default=None, max_length=128),
        category: str | None = Query(default=None, max_length=64),
        limit: int = Query(default=20, ge=1, le=MAX_SEARCH_PAGE),
        offset: Offset = 0,
    ) -> dict[str, Any]:
        if mode not in SEARCH_MODES or (match is not None and match not in SEARCH_MATCHES):
            raise HTTPException(422, f"mode must be one of {', '.join(SEARCH_MODES)}; match any or all")
        with console_errors(me):
            where = FactFilter(user_id=validate_user_id(user or None), category=category or None)
            page = search_facts(
                q,
                where,
                mode=mode,
                match=match,
                limit=limit,
                offset=offset,
                tenant_id=me.tenant(tenant),
            )
        return page.to_json()

    @router.get("/users/{user_id}/sessions")
    def sessions(
        user_id: str,
        me: Operator = caller,
        tenant: str | None = None,
        limit: int = Query(default=50, ge=1, le=MAX_LIST_LIMIT),
        offset: Offset = 0,
    ) -> dict[str, Any]:
        with console_errors(me):
            listed = list_sessions(
                validate_user_id(user_id), tenant_id=me.tenant(tenant), limit=limit + 1, offset=offset
            )
        following = offset + limit if len(listed) > limit else None
        return {
            "sessions": [info_dict(info) for info in listed[:limit]],
            "offset": offset,
            "next_offset": following,
        }

    @router.get("/users/{user_id}/sessions/{session_id}")
    def session(
        user_id: str,
        session_id: str,
        me: Operator = caller,
        tenant: str | None = None,
        agent: str | None = None,
    ) -> dict[str, Any]:
        with console_errors(me):
            info, turns = read_session(
                validate_user_id(user_id),
                session_id,
                agent_name=exact_agent(agent),
                tenant_id=me.tenant(tenant),
            )
        if info is None:
            raise HTTPException(404, "no such session (or it expired)")
        return {"session": info_dict(info), "turns": [turn_dict(turn) for turn in turns]}

    @router.get("/agent-docs")
    def agent_docs(
        me: Operator = caller,
        tenant: str | None = None,
        user: str | None = Query(default=None, max_length=128),
        limit: int = Query(default=50, ge=1, le=MAX_DOC_SCOPES),
        offset: Offset = 0,
    ) -> dict[str, Any]:
        with console_errors(me):
            tenant_id, owner = me.tenant(tenant), validate_user_id(user or None)
            engine = directory_engine(get_memory_storage(), "the console's agent document list")
            return doc_scopes(engine, tenant_id, user_id=owner, limit=limit, offset=offset)

    @router.get("/agent-docs/documents")
    def documents(
        me: Operator = caller, tenant: str | None = None, agent: str | None = None, user: str | None = None
    ) -> dict[str, Any]:
        with console_errors(me):
            scope = DocScope(exact_agent(agent), validate_user_id(user or None), me.tenant(tenant))
            listed = list_docs(scope)
        return {"documents": [document_fields(doc) for doc in listed]}

    @router.get("/agent-docs/document")
    def document(
        me: Operator = caller,
        path: str = Query(min_length=1, max_length=1024),
        tenant: str | None = None,
        agent: str | None = None,
        user: str | None = None,
    ) -> dict[str, Any]:
        with console_errors(me):
            scope = DocScope(exact_agent(agent), validate_user_id(user or None), me.tenant(tenant))
            doc = read_doc(scope, path)
            versions = doc_history(scope, path, limit=MAX_HISTORY_LIMIT)
        return {"document": document_fields(doc), "versions": [version_fields(entry) for entry in versions]}

    return router
