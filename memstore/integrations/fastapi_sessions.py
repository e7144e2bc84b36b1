"""The ``/sessions`` routes of ``/api/memory``: the caller's short-term session memory.

``create_memory_router`` adds them to its router with its own caller dependency, so a session is
always the caller's: user and tenant come from the gateway's dependencies, and the agent is none,
as for the fact routes. A session of another user or tenant is a 404, exactly as a session that does not
exist. The work is ``memstore.ops.sessions``'s (caps, validation, compression on the queue); the
errors are ``fastapi_errors.mapped_errors``'s: an invalid turn is a 422 naming the rule (never
quoting the turn), a write past a cap a 429 whose ``X-Memstore-Limit`` header says which, the
session store down a 503.

An append's body is bounded here, not only by the mounting app: over ``MAX_APPEND_BODY_BYTES`` it
is a 413 before it is parsed, on the declared ``Content-Length`` or, for a chunked body, once the
bytes received pass it.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the handlers' annotations,
# which refer to ``add_session_routes``' local ``Owner``.

from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response

from memstore.async_face import run_on_loop
from memstore.gateway.session_tools import MAX_CONTEXT_TOKENS, MAX_LIST_OFFSET
from memstore.integrations.fastapi_errors import LIMIT_HEADER, MemoryRoute, mapped_errors
from memstore.integrations.fastapi_models import (
    ErrorResponse,
    SessionAppendRequest,
    SessionClearedResponse,
    SessionContextResponse,
    SessionListResponse,
    SessionResponse,
    ValidationErrorResponse,
)
from memstore.ops.sessions import (
    MAX_LIST_LIMIT,
    append_turns,
    clear_session,
    info_dict,
    list_sessions,
    read_session,
    session_context,
    turn_dict,
)
from memstore.session import SESSION_ID_PATTERN

MAX_APPEND_BODY_BYTES = 8 * 1024 * 1024
"""The largest ``POST /sessions/{session_id}/turns`` body read (a 413 beyond)."""

SessionId = Annotated[
    str,
    Path(
        pattern=f"^{SESSION_ID_PATTERN.pattern}$",
        description="1-128 characters from A-Z a-z 0-9 _ . : -",
    ),
]

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "The caller's tenant or roles are invalid"},
    422: {"model": ValidationErrorResponse, "description": "Invalid input, session id or user id"},
    503: {"model": ErrorResponse, "description": "The session store (database or Redis) is unreachable"},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No such session of the caller (or it expired)"},
}
_APPEND_ERRORS: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorResponse, "description": f"A request body over {MAX_APPEND_BODY_BYTES} bytes"},
    429: {
        "model": ErrorResponse,
        "description": f"Nothing was stored: the session holds session_max_stored_turns raw turns "
        f"waiting for compression ({LIMIT_HEADER}: turns; retry later), or a new session would pass "
        f"session_max_per_user ({LIMIT_HEADER}: sessions)",
    },
}


class SessionOwner(Protocol):
    """Who a request acts for (the memory router's ``Caller``)."""

    @property
    def user_id(self) -> str: ...

    @property
    def tenant_id(self) -> str: ...


class SessionRoute(MemoryRoute):
    """``MemoryRoute`` that reads at most ``MAX_APPEND_BODY_BYTES`` of a request body."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            await _read_bounded_body(request)
            return await handler(request)

        return handle


async def _read_bounded_body(request: Request) -> None:
    too_large = HTTPException(413, f"Request body over {MAX_APPEND_BODY_BYTES} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_APPEND_BODY_BYTES:
        raise too_large
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > MAX_APPEND_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    request._body = b"".join(chunks)  # what FastAPI's handler parses: Starlette's cached body


def _not_found(session_id: str) -> HTTPException:
    return HTTPException(404, f"Session '{session_id}' not found.")


def add_session_routes(router: APIRouter, current_owner: Callable[..., Any]) -> None:
    """Add the ``/sessions`` routes over ``current_owner``'s sessions (a dependency of the memory
    router) to ``router``; they are its own routes, so ``router.routes`` lists them."""
    Owner = Annotated[SessionOwner, Depends(current_owner)]

    @router.get(
        "/sessions",
        summary="List the caller's sessions, the most recently active first",
        response_model=SessionListResponse,
        responses=_ERRORS,
    )
    async def list_caller_sessions(
        owner: Owner,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = 100,
        offset: Annotated[int, Query(ge=0, le=MAX_LIST_OFFSET)] = 0,
    ) -> SessionListResponse:
        with mapped_errors(owner.user_id):
            found = await run_on_loop(
                list_sessions, owner.user_id, tenant_id=owner.tenant_id, limit=limit, offset=offset
            )
        return SessionListResponse.model_validate(
            {"sessions": [info_dict(info) for info in found], "limit": limit, "offset": offset}
        )

    @router.get(
        "/sessions/{session_id}",
        summary="A session of the caller: its bookkeeping and every stored turn",
        response_model=SessionResponse,
        response_model_exclude_unset=True,
        responses={**_ERRORS, **_NOT_FOUND},
    )
    async def show_session(session_id: SessionId, owner: Owner) -> SessionResponse:
        with mapped_errors(owner.user_id):
            info, turns = await run_on_loop(
                read_session, owner.user_id, session_id, tenant_id=owner.tenant_id
            )
        if info is None:
            raise _not_found(session_id)
        return SessionResponse.model_validate(
            {"session": info_dict(info), "turns": [turn_dict(turn) for turn in turns]}
        )

    @router.get(
        "/sessions/{session_id}/context",
        summary="The session as the next prompt takes it: the summary, then the newest turns that fit",
        response_model=SessionContextResponse,
        responses=_ERRORS,
    )
    async def session_prompt_context(
        session_id: SessionId,
        owner: Owner,
        max_tokens: Annotated[
            int | None,
            Query(ge=1, le=MAX_CONTEXT_TOKENS, description="Token budget (session_context_max_tokens)"),
        ] = None,
    ) -> SessionContextResponse:
        with mapped_errors(owner.user_id):
            context = await run_on_loop(
                session_context, owner.user_id, session_id, tenant_id=owner.tenant_id, max_tokens=max_tokens
            )
        return SessionContextResponse(
            messages=context.messages, summary=context.summary, omitted=context.omitted, tokens=context.tokens
        )

    async def append_session_turns(
        session_id: SessionId, request: SessionAppendRequest, owner: Owner
    ) -> SessionResponse:
        turns = [turn.model_dump(exclude_none=True) for turn in request.turns]
        with mapped_errors(owner.user_id):
            appended = await run_on_loop(
                append_turns, owner.user_id, session_id, turns, tenant_id=owner.tenant_id
            )
        return SessionResponse.model_validate(
            {"session": info_dict(appended.info), "turns": [turn_dict(turn) for turn in appended.turns]}
        )

    router.add_api_route(
        "/sessions/{session_id}/turns",
        append_session_turns,
        methods=["POST"],
        route_class_override=SessionRoute,  # the one route that takes a body: read it bounded
        summary="Append turns to a session of the caller (created on the first append)",
        response_model=SessionResponse,
        response_model_exclude_unset=True,
        responses={**_ERRORS, **_APPEND_ERRORS},
    )

    @router.delete(
        "/sessions/{session_id}",
        summary="Clear a session of the caller: its turns and summary",
        response_model=SessionClearedResponse,
        responses={**_ERRORS, **_NOT_FOUND},
    )
    async def clear_caller_session(session_id: SessionId, owner: Owner) -> SessionClearedResponse:
        with mapped_errors(owner.user_id):
            cleared = await run_on_loop(clear_session, owner.user_id, session_id, tenant_id=owner.tenant_id)
        if not cleared:
            raise _not_found(session_id)
        return SessionClearedResponse(sessionId=session_id, cleared=True)
