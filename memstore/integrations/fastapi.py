"""The reference's ``/api/memory`` endpoints as an ``APIRouter`` a gateway mounts.

Every endpoint works on the calling user's own memory (agent ``None``). Who the caller is comes
only from the ``current_user_id`` dependency the gateway passes in, typically its
authentication; nothing a client sends can pick another user's scope. The optional
``current_tenant_id`` and ``current_roles`` dependencies say the caller's tenant (default: the
default tenant; an invalid one is a 400) and roles (which decide whether it may create shared and
public facts: 403 without ``editor`` or ``admin``). A fact id that is not in the caller's scope is
a 404, whoever else owns it.

Handlers are coroutines on memstore's async face (``memstore.async_face``): the database is reached
through the async driver on the event loop, so a request holds no thread and a slow database holds
no pool. The errors, caps and identity are the sync API's: it is the same core.

The ``/sessions`` routes (``fastapi_sessions.py``) keep the caller's short-term session memory,
under the same identity; the ``/agents/{agent_name}`` routes (``fastapi_agent_docs.py``) read and
edit an agent's own memory documents for it.

Request models (``fastapi_models.py``) carry the core's size caps (``memstore.document``), so an
oversized fact, summary or import is a 422 before it reaches storage. Apart from a session append
(``fastapi_sessions.MAX_APPEND_BODY_BYTES``), the router does not limit the raw body size: that is
the mounting app's or its proxy's job (``memstore serve`` sets one).
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the handlers' annotations,
# which refer to the factory's local ``Owner``.

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

try:
    from fastapi import APIRouter, BackgroundTasks, Depends, HTTPException, Query
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without the extra
    raise ImportError("memstore.integrations.fastapi needs FastAPI: pip install 'memstore[server]'") from exc

from memstore.async_face import run_on_loop
from memstore.config import get_memory_config
from memstore.document import MAX_CATEGORY_CHARS, MAX_FACT_CHARS, MemoryDocument
from memstore.errors import InvalidScopeError
from memstore.integrations.fastapi_agent_docs import add_agent_doc_routes
from memstore.integrations.fastapi_errors import MemoryRoute, mapped_errors
from memstore.integrations.fastapi_models import (
    AgentDocumentDeletedResponse,
    AgentDocumentEditRequest,
    AgentDocumentHistoryResponse,
    AgentDocumentListResponse,
    AgentDocumentResponse,
    AgentDocumentWriteRequest,
    ContextSection,
    ErrorResponse,
    Fact,
    FactCreateRequest,
    FactPatchRequest,
    FactRelation,
    FactRetention,
    HistoryContext,
    MemoryConfigResponse,
    MemoryImportRequest,
    MemoryResponse,
    MemoryStatusResponse,
    SessionAppendRequest,
    SessionClearedResponse,
    SessionContextResponse,
    SessionInfoResponse,
    SessionListResponse,
    SessionResponse,
    SessionTurnRequest,
    SessionTurnResponse,
    UserContext,
    ValidationErrorResponse,
)
from memstore.integrations.fastapi_sessions import add_session_routes
from memstore.ops.facts import (
    clear_memory_data,
    create_memory_fact,
    delete_memory_fact,
    get_memory_data,
    import_memory_data,
    reload_memory_data,
    search_memory_facts,
    update_memory_fact,
)
from memstore.ops.lifecycle import with_retention
from memstore.ops.transfer import embed_imported
from memstore.scope import DEFAULT_TENANT_ID, validate_roles, validate_tenant_id
from memstore.storage.loader import get_memory_storage
from memstore.storage.records import SearchMode

logger = logging.getLogger(__name__)

__all__ = [
    "AgentDocumentDeletedResponse",
    "AgentDocumentEditRequest",
    "AgentDocumentHistoryResponse",
    "AgentDocumentListResponse",
    "AgentDocumentResponse",
    "AgentDocumentWriteRequest",
    "ContextSection",
    "ErrorResponse",
    "Fact",
    "FactCreateRequest",
    "FactPatchRequest",
    "FactRelation",
    "FactRetention",
    "HistoryContext",
    "MemoryConfigResponse",
    "MemoryImportRequest",
    "MemoryResponse",
    "MemoryStatusResponse",
    "SessionAppendRequest",
    "SessionClearedResponse",
    "SessionContextResponse",
    "SessionInfoResponse",
    "SessionListResponse",
    "SessionResponse",
    "SessionTurnRequest",
    "SessionTurnResponse",
    "UserContext",
    "create_memory_router",
]


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "The caller's tenant or roles are invalid"},
    422: {"model": ValidationErrorResponse, "description": "Invalid input or user id"},
    503: {
        "model": ErrorResponse,
        "description": "The memory database (or, for a search by meaning, the embeddings endpoint) "
        "is unreachable or refused the request",
    },
}
_FORBIDDEN: dict[int | str, dict[str, Any]] = {
    403: {"model": ErrorResponse, "description": "Shared and public facts need the role editor or admin"},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No fact with this id in the caller's memory"},
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {
        "model": ErrorResponse,
        "description": "Nothing was stored: the same content is already stored as another fact, "
        "(PATCH) another writer changed this fact first, or the memory was erased while this "
        "request ran (reload and retry)",
    },
}


@dataclass(frozen=True)
class Caller:
    """Who a request acts for, as the router's dependencies said."""

    user_id: str
    tenant_id: str
    roles: frozenset[str]

    @property
    def scope(self) -> dict[str, Any]:
        """The keywords every fact helper takes for this caller."""
        return {"user_id": self.user_id, "tenant_id": self.tenant_id, "roles": self.roles}


def _no_tenant() -> str | None:
    return None


def _no_roles() -> Iterable[str] | None:
    return None


def _memory(document: MemoryDocument, caller: Caller) -> MemoryResponse:
    facts = document.get("facts")
    if isinstance(facts, list):
        document = {**document, "facts": _with_retention(facts, caller)}
    return MemoryResponse.model_validate(document)


def _with_retention(facts: list[dict[str, Any]], caller: Caller) -> list[dict[str, Any]]:
    storage = get_memory_storage().for_identity(caller.tenant_id, caller.roles)
    return with_retention(facts, user_id=caller.user_id, storage=storage)


def _embed_import(caller: Caller) -> None:
    """After ``POST /import`` has answered: embed the caller's facts that lack a vector.

    It runs after the response, in FastAPI's thread pool (bulk embedding is long work that waits
    on its own pool: it must not hold the event loop), so a large import is not held up by the
    model; a failure is a WARNING (the import is stored; the next update, or ``memstore embed``,
    embeds the rest).
    """
    storage = get_memory_storage().for_identity(caller.tenant_id, caller.roles)
    outcome = embed_imported(storage, [(caller.user_id, None)])
    if outcome.error is not None:
        logger.warning(
            "the imported memory is stored, but embedding its facts failed (%d embedded): %s; "
            "`memstore embed` finishes it",
            outcome.embedded,
            outcome.error,
        )


def _record_fields(request: FactCreateRequest | FactPatchRequest) -> dict[str, Any]:
    """The request's memory-record fields as the fact helpers take them (``None``: not given)."""
    return {
        "memory_type": request.memory_type,
        "importance": request.importance,
        "tags": request.tags,
        "source_kind": request.source_kind,
        "raw": request.raw,
        "structured": request.structured,
    }


def _config() -> MemoryConfigResponse:
    return MemoryConfigResponse.model_validate(get_memory_config().model_dump())


def create_memory_router(
    current_user_id: Callable[..., Any],
    *,
    prefix: str = "/api/memory",
    current_tenant_id: Callable[..., Any] | None = None,
    current_roles: Callable[..., Any] | None = None,
) -> APIRouter:
    """The memory endpoints under ``prefix``.

    ``current_user_id`` is a FastAPI dependency (it may itself depend on the request, a token,
    a session...) returning the caller's memstore user id; see ``memstore.make_safe_user_id``
    for mapping external identities. ``current_tenant_id`` (returning a tenant id, or ``None``
    for the default tenant) and ``current_roles`` (returning role names) are dependencies too,
    from the same trusted source; without them every caller is in the default tenant, with no roles.
    """
    router = APIRouter(prefix=prefix, tags=["memory"], route_class=MemoryRoute)

    async def caller_of(
        owner: Annotated[str, Depends(current_user_id)],
        tenant: Annotated[str | None, Depends(current_tenant_id or _no_tenant)],
        roles: Annotated[Iterable[str] | None, Depends(current_roles or _no_roles)],
    ) -> Caller:
        try:
            return Caller(
                owner,
                validate_tenant_id(DEFAULT_TENANT_ID if tenant is None else tenant),
                validate_roles(roles),
            )
        except InvalidScopeError as exc:
            raise HTTPException(400, str(exc)) from exc

    Owner = Annotated[Caller, Depends(caller_of)]
    document_route: dict[str, Any] = {
        "response_model": MemoryResponse,
        "response_model_exclude_none": True,
        "responses": _ERRORS,
    }

    @router.get("", summary="Get the caller's memory", **document_route)
    async def get_memory(owner: Owner) -> MemoryResponse:
        with mapped_errors(owner.user_id):
            return await run_on_loop(lambda: _memory(get_memory_data(**owner.scope), owner))

    @router.post("/reload", summary="Re-read the caller's memory from the database", **document_route)
    async def reload_memory(owner: Owner) -> MemoryResponse:
        with mapped_errors(owner.user_id):
            return await run_on_loop(lambda: _memory(reload_memory_data(**owner.scope), owner))

    @router.delete("", summary="Erase the caller's memory", **document_route)
    async def clear_memory(owner: Owner) -> MemoryResponse:
        with mapped_errors(owner.user_id):
            return await run_on_loop(lambda: _memory(clear_memory_data(**owner.scope), owner))

    @router.get("/export", summary="Export the caller's memory document", **document_route)
    async def export_memory(owner: Owner) -> MemoryResponse:
        with mapped_errors(owner.user_id):
            return await run_on_loop(lambda: _memory(get_memory_data(**owner.scope), owner))

    @router.post(
        "/import",
        summary="Replace the caller's memory with a document",
        **{**document_route, "responses": {**_ERRORS, **_FORBIDDEN}},
    )
    async def import_memory(
        document: MemoryImportRequest,
        owner: Owner,
        background: BackgroundTasks,
        embed: Annotated[
            bool, Query(description="Embed the imported facts after the response (semantic search needs it)")
        ] = True,
    ) -> MemoryResponse:
        given = document.model_dump(exclude_none=True)
        with mapped_errors(owner.user_id):
            stored = await run_on_loop(lambda: _memory(import_memory_data(given, **owner.scope), owner))
        if embed:
            background.add_task(_embed_import, owner)
        return stored

    @router.get(
        "/facts",
        summary="Search the caller's facts, best match first",
        response_model=list[Fact],
        response_model_exclude_none=True,
        responses=_ERRORS,
    )
    async def search_facts(
        owner: Owner,
        q: Annotated[
            str,
            Query(min_length=1, max_length=MAX_FACT_CHARS, description="Text to look for in fact content"),
        ],
        category: Annotated[
            str | None, Query(max_length=MAX_CATEGORY_CHARS, description="Only facts of this category")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 10,
        mode: Annotated[
            SearchMode,
            Query(description="fulltext (words), semantic (meaning) or hybrid (both, fused)"),
        ] = "fulltext",
    ) -> list[Fact]:
        with mapped_errors(owner.user_id):
            shown = await run_on_loop(
                lambda: _with_retention(
                    search_memory_facts(q, category, limit, mode=mode, **owner.scope), owner
                )
            )
        return [Fact.model_validate(fact) for fact in shown]

    @router.post(
        "/facts",
        summary="Add a fact to the caller's memory",
        response_model=MemoryResponse,
        response_model_exclude_none=True,
        responses={**_ERRORS, **_FORBIDDEN, **_CONFLICT},
    )
    async def create_fact(request: FactCreateRequest, owner: Owner) -> MemoryResponse:
        with mapped_errors(owner.user_id):
            return await run_on_loop(
                lambda: _memory(
                    create_memory_fact(
                        request.content,
                        request.category,
                        request.confidence,
                        visibility=request.visibility,
                        allowed_users=request.allowed_users,
                        allowed_roles=request.allowed_roles,
                        **_record_fields(request),
                        **owner.scope,
                    ),
                    owner,
                )
            )

    @router.patch(
        "/facts/{fact_id}",
        summary="Change a fact",
        response_model=MemoryResponse,
        response_model_exclude_none=True,
        responses={**_ERRORS, **_FORBIDDEN, **_NOT_FOUND, **_CONFLICT},
    )
    async def update_fact(fact_id: str, request: FactPatchRequest, owner: Owner) -> MemoryResponse:
        with mapped_errors(owner.user_id):
            return await run_on_loop(
                lambda: _memory(
                    update_memory_fact(
                        fact_id,
                        content=request.content,
                        category=request.category,
                        confidence=request.confidence,
                        visibility=request.visibility,
                        allowed_users=request.allowed_users,
                        allowed_roles=request.allowed_roles,
                        **_record_fields(request),
                        **owner.scope,
                    ),
                    owner,
                )
            )

    @router.delete(
        "/facts/{fact_id}",
        summary="Delete a fact",
        response_model=MemoryResponse,
        response_model_exclude_none=True,
        responses={**_ERRORS, **_NOT_FOUND, **_CONFLICT},
    )
    async def delete_fact(fact_id: str, owner: Owner) -> MemoryResponse:
        with mapped_errors(owner.user_id):
            return await run_on_loop(lambda: _memory(delete_memory_fact(fact_id, **owner.scope), owner))

    @router.get(
        "/config",
        summary="Memory settings",
        response_model=MemoryConfigResponse,
        dependencies=[Depends(current_user_id)],
    )
    def memory_config() -> MemoryConfigResponse:
        return _config()

    @router.get(
        "/status",
        summary="Memory settings and the caller's memory",
        response_model=MemoryStatusResponse,
        response_model_exclude_none=True,
        responses=_ERRORS,
    )
    async def memory_status(owner: Owner) -> MemoryStatusResponse:
        with mapped_errors(owner.user_id):
            data = await run_on_loop(lambda: _memory(get_memory_data(**owner.scope), owner))
        return MemoryStatusResponse(config=_config(), data=data)

    add_session_routes(router, caller_of)
    add_agent_doc_routes(router, caller_of)
    return router
