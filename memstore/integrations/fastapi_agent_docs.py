"""The ``/agents/{agent_name}`` routes of ``/api/memory``: an agent's own memory documents.

``create_memory_router`` adds them with its caller dependency. They are the gateway's and the
operator's face of the documents the agent edits through its file tools: the same checks, caps and
versions (``memstore.ops.agent_docs``), with the caller's user recorded as the actor. Which
documents a call reaches is ``doc_scope``'s rule, as for the agent's tools: the agent's own in the
caller's tenant, or with ``agent_doc_per_user`` the caller's own of that agent. Anyone may list
and read them (they are in the prompt anyway); the agent's shared documents reach every user's
prompt, so changing them, or reading their history (which names the users whose conversations
wrote them), needs the ``admin`` role (a 403 otherwise; the author is then ``operator``), while a
user's own documents are theirs to change (the author ``user``).

A document's virtual path holds slashes, so it travels as the ``path`` query parameter of one
``/document`` resource rather than in the URL path. Every write takes ``expected_version``: a
client that read version 3 and writes with 3 cannot overwrite what an agent wrote meanwhile; it
gets a 409 with both versions. The errors are ``fastapi_errors.mapped_errors``'s: a path or edit
that breaks a rule is a 422 naming the rule (never quoting the path or text), no such document a
404, a document or agent over its caps a 413, the database down a 503. A body over
``MAX_APPEND_BODY_BYTES`` is a 413 before it is parsed.
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the handlers' annotations,
# which refer to ``add_agent_doc_routes``' local ``Owner``.

from collections.abc import Callable
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, Path, Query

from memstore.agent_doc import DOC_ROOT, AgentDocument, DocScope, DocVersion
from memstore.async_face import run_on_loop
from memstore.errors import AccessDeniedError
from memstore.integrations.fastapi_errors import mapped_errors
from memstore.integrations.fastapi_models import (
    AgentDocumentConflictResponse,
    AgentDocumentDeletedResponse,
    AgentDocumentEditRequest,
    AgentDocumentHistoryResponse,
    AgentDocumentListResponse,
    AgentDocumentResponse,
    AgentDocumentVersionResponse,
    AgentDocumentWriteRequest,
    ErrorResponse,
    ValidationErrorResponse,
)
from memstore.integrations.fastapi_sessions import MAX_APPEND_BODY_BYTES, SessionOwner, SessionRoute
from memstore.ops.agent_docs import (
    MAX_HISTORY_LIMIT,
    delete_doc,
    doc_history,
    doc_scope,
    document_fields,
    edit_doc,
    list_docs,
    read_doc,
    version_fields,
    write_doc,
)
from memstore.scope import AGENT_NAME_PATTERN

SHARED_WRITER_ROLE = "admin"
"""The role that may change, and read the history of, an agent's documents shared by its users."""


class DocCaller(SessionOwner, Protocol):
    """Who a request acts for (the memory router's ``Caller``), roles included."""

    @property
    def roles(self) -> frozenset[str]: ...


MAX_OFFSET = 2**63 - 1
"""The largest OFFSET both databases take (a signed 64-bit integer)."""

AgentName = Annotated[
    str, Path(pattern=AGENT_NAME_PATTERN.pattern, description="The agent: 1-128 of A-Z a-z 0-9 -")
]
DocPath = Annotated[str, Query(description="The document's virtual path, such as /memories/agent.md")]

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "The caller's tenant or roles are invalid"},
    422: {
        "model": ValidationErrorResponse,
        "description": "An invalid agent name or input, or a path outside /memories/ (the rule it breaks)",
    },
    503: {"model": ErrorResponse, "description": "The memory database is unreachable"},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "No live document at this path"},
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {
        "model": AgentDocumentConflictResponse,
        "description": "Nothing was stored: the document is not at expected_version (another writer "
        "changed, created or deleted it); read it again",
    },
}
_FORBIDDEN: dict[int | str, dict[str, Any]] = {
    403: {
        "model": ErrorResponse,
        "description": "The agent's shared documents: changing them or reading their history needs the "
        "admin role",
    },
}
_WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    **_CONFLICT,
    **_FORBIDDEN,
    413: {
        "model": ErrorResponse,
        "description": f"Nothing was stored: the agent's documents would pass agent_doc_max_docs or "
        f"agent_doc_max_total_chars, or the body is over {MAX_APPEND_BODY_BYTES} bytes",
    },
}


def _document(doc: AgentDocument) -> AgentDocumentResponse:
    return AgentDocumentResponse.model_validate(document_fields(doc))


def _version(entry: DocVersion) -> AgentDocumentVersionResponse:
    return AgentDocumentVersionResponse.model_validate(version_fields(entry))


def add_agent_doc_routes(router: APIRouter, current_owner: Callable[..., Any]) -> None:
    """Add the ``/agents/{agent_name}`` document routes over ``current_owner`` (the memory router's
    caller dependency) to ``router``."""
    Owner = Annotated[DocCaller, Depends(current_owner)]

    def scope(agent_name: str, owner: DocCaller) -> DocScope:
        return doc_scope(agent_name, owner.user_id, owner.tenant_id)

    def changing(agent_name: str, owner: DocCaller) -> tuple[DocScope, str]:
        """The scope a change reaches and its author; the agent's shared documents go into every
        user's prompt, so only an ``admin`` caller changes them (or reads their history)."""
        docs = scope(agent_name, owner)
        if docs.user_id is not None:
            return docs, "user"
        if SHARED_WRITER_ROLE not in owner.roles:
            raise AccessDeniedError(
                f"the agent's documents are shared by all its users: changing them, or reading their "
                f"history, needs the {SHARED_WRITER_ROLE} role"
            )
        return docs, "operator"

    @router.get(
        "/agents/{agent_name}/documents",
        summary="List the agent's memory documents (without their text)",
        response_model=AgentDocumentListResponse,
        response_model_exclude_none=True,
        responses=_ERRORS,
    )
    async def list_agent_documents(
        agent_name: AgentName,
        owner: Owner,
        folder: Annotated[str, Query(description="Only the documents under this folder")] = DOC_ROOT,
    ) -> AgentDocumentListResponse:
        with mapped_errors(owner.user_id):
            docs = scope(agent_name, owner)
            found = await run_on_loop(list_docs, docs, folder, actor=owner.user_id)
        return AgentDocumentListResponse(
            agentName=docs.agent_name or agent_name, documents=[_document(doc) for doc in found]
        )

    @router.get(
        "/agents/{agent_name}/document",
        summary="Read one of the agent's memory documents, with its version",
        response_model=AgentDocumentResponse,
        responses={**_ERRORS, **_NOT_FOUND},
    )
    async def read_agent_document(
        agent_name: AgentName, path: DocPath, owner: Owner
    ) -> AgentDocumentResponse:
        with mapped_errors(owner.user_id):
            return _document(await run_on_loop(read_doc, scope(agent_name, owner), path, actor=owner.user_id))

    async def write_agent_document(
        agent_name: AgentName, path: DocPath, request: AgentDocumentWriteRequest, owner: Owner
    ) -> AgentDocumentResponse:
        with mapped_errors(owner.user_id):
            docs, author = changing(agent_name, owner)
            written = await run_on_loop(
                write_doc,
                docs,
                path,
                request.content,
                expected_version=request.expected_version,
                author=author,
                actor=owner.user_id,
            )
        return _document(written)

    async def edit_agent_document(
        agent_name: AgentName, path: DocPath, request: AgentDocumentEditRequest, owner: Owner
    ) -> AgentDocumentResponse:
        with mapped_errors(owner.user_id):
            docs, author = changing(agent_name, owner)
            edited = await run_on_loop(
                edit_doc,
                docs,
                path,
                request.old_string,
                request.new_string,
                expected_version=request.expected_version,
                author=author,
                actor=owner.user_id,
            )
        return _document(edited)

    for handler, method, summary in (
        (write_agent_document, "PUT", "Write a whole memory document of the agent (created if new)"),
        (edit_agent_document, "PATCH", "Replace one exact piece of a memory document of the agent"),
    ):
        router.add_api_route(
            "/agents/{agent_name}/document",
            handler,
            methods=[method],
            route_class_override=SessionRoute,  # reads the body bounded, as a session append does
            summary=summary,
            response_model=AgentDocumentResponse,
            responses={**_ERRORS, **_WRITE_ERRORS, **(_NOT_FOUND if method == "PATCH" else {})},
        )

    @router.delete(
        "/agents/{agent_name}/document",
        summary="Delete a memory document of the agent (its history is kept)",
        response_model=AgentDocumentDeletedResponse,
        responses={**_ERRORS, **_NOT_FOUND, **_CONFLICT, **_FORBIDDEN},
    )
    async def delete_agent_document(
        agent_name: AgentName,
        path: DocPath,
        owner: Owner,
        expected_version: Annotated[
            int | None, Query(ge=1, description="Delete only this version (default: whatever is stored)")
        ] = None,
    ) -> AgentDocumentDeletedResponse:
        with mapped_errors(owner.user_id):
            docs, author = changing(agent_name, owner)
            version = await run_on_loop(
                delete_doc,
                docs,
                path,
                expected_version=expected_version,
                author=author,
                actor=owner.user_id,
            )
        return AgentDocumentDeletedResponse(path=path, version=version, deleted=True)

    @router.get(
        "/agents/{agent_name}/history",
        summary="The versions of a memory document of the agent (or of all of them), newest first",
        response_model=AgentDocumentHistoryResponse,
        responses={**_ERRORS, **_FORBIDDEN},
    )
    async def agent_document_history(
        agent_name: AgentName,
        owner: Owner,
        path: Annotated[str | None, Query(description="One document (default: every one)")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_HISTORY_LIMIT)] = 50,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    ) -> AgentDocumentHistoryResponse:
        with mapped_errors(owner.user_id):
            versions = await run_on_loop(
                doc_history, changing(agent_name, owner)[0], path, limit=limit, offset=offset
            )
        return AgentDocumentHistoryResponse(
            versions=[_version(entry) for entry in versions], limit=limit, offset=offset
        )
