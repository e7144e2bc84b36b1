"""The reference's ``/api/memory`` endpoints as an ``APIRouter`` a gateway mounts.

Every endpoint works on the calling user's own memory (agent ``None``). Who the caller is comes
only from the ``current_user_id`` dependency the gateway passes in, typically its
authentication; nothing a client sends can pick another user's scope. A fact id that is not in
the caller's scope is a 404, whoever else owns it.

Handlers are plain functions: FastAPI runs them in its thread pool, so blocking database I/O
never stalls the event loop.

Request models carry the core's size caps (``memstore.document``), so an oversized fact, summary
or import is a 422 before it reaches storage. The router does not limit the raw body size: that
is the mounting app's or its proxy's job (``memstore serve`` sets one).
"""

# No ``from __future__ import annotations``: FastAPI must evaluate the handlers' annotations,
# which refer to the factory's local ``Owner``.

from collections.abc import Callable, Coroutine, Mapping
from typing import Annotated, Any

try:
    from fastapi import APIRouter, Depends, Query, Request, Response
    from fastapi.exceptions import RequestValidationError
    from fastapi.routing import APIRoute
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without the extra
    raise ImportError("memstore.integrations.fastapi needs FastAPI: pip install 'memstore[server]'") from exc

from pydantic import BaseModel, ConfigDict, Field

from memstore.config import get_memory_config
from memstore.document import (
    DEFAULT_CATEGORY,
    MANUAL_CONFIDENCE,
    MAX_CATEGORY_CHARS,
    MAX_DOCUMENT_FACTS,
    MAX_FACT_CHARS,
    MAX_SUMMARY_CHARS,
    MemoryDocument,
)
from memstore.integrations.fastapi_errors import mapped_errors
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
from memstore.storage.records import SearchMode

__all__ = [
    "ContextSection",
    "ErrorResponse",
    "Fact",
    "FactCreateRequest",
    "FactPatchRequest",
    "FactRetention",
    "HistoryContext",
    "MemoryConfigResponse",
    "MemoryImportRequest",
    "MemoryResponse",
    "MemoryStatusResponse",
    "UserContext",
    "create_memory_router",
]


class ContextSection(BaseModel):
    # Extra keys are kept so an export imports back without losing anything.
    model_config = ConfigDict(extra="allow")

    summary: str = ""
    updatedAt: str = ""


class UserContext(BaseModel):
    workContext: ContextSection = Field(default_factory=ContextSection)
    personalContext: ContextSection = Field(default_factory=ContextSection)
    topOfMind: ContextSection = Field(default_factory=ContextSection)


class HistoryContext(BaseModel):
    recentMonths: ContextSection = Field(default_factory=ContextSection)
    earlierContext: ContextSection = Field(default_factory=ContextSection)
    longTermBackground: ContextSection = Field(default_factory=ContextSection)


class FactRetention(BaseModel):
    """Read-only (docs/operations.md#retention-eviction-decay-and-expiry); an import ignores it."""

    lastConfirmedAt: str | None = Field(default=None, description="last re-stated by the extractor")
    lastAccessedAt: str | None = Field(default=None, description="last injected or returned by a search")
    accessCount: int = Field(default=0, description="times injected or returned by a search")
    score: float = Field(description="eviction score now: max_facts keeps the highest")


class Fact(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    content: str
    category: str = DEFAULT_CATEGORY
    confidence: float = 0.5
    createdAt: str = ""
    source: str = "unknown"
    sourceError: str | None = None
    retention: FactRetention | None = Field(
        default=None, description="Read-only: the fact's retention signals and eviction score"
    )


class MemoryResponse(BaseModel):
    """One user's memory document, as stored (responses carry no caps: older data may exceed them)."""

    version: str = "1.0"
    lastUpdated: str = ""
    user: UserContext = Field(default_factory=UserContext)
    history: HistoryContext = Field(default_factory=HistoryContext)
    facts: list[Fact] = Field(default_factory=list)


class ImportedSection(ContextSection):
    summary: str = Field(default="", max_length=MAX_SUMMARY_CHARS)


class ImportedUserContext(UserContext):
    workContext: ImportedSection = Field(default_factory=ImportedSection)
    personalContext: ImportedSection = Field(default_factory=ImportedSection)
    topOfMind: ImportedSection = Field(default_factory=ImportedSection)


class ImportedHistoryContext(HistoryContext):
    recentMonths: ImportedSection = Field(default_factory=ImportedSection)
    earlierContext: ImportedSection = Field(default_factory=ImportedSection)
    longTermBackground: ImportedSection = Field(default_factory=ImportedSection)


class ImportedFact(Fact):
    content: str = Field(max_length=MAX_FACT_CHARS)
    category: str = Field(default=DEFAULT_CATEGORY, max_length=MAX_CATEGORY_CHARS)
    sourceError: str | None = Field(default=None, max_length=MAX_FACT_CHARS)
    # Read-only: accepted (an export imports again) and dropped.
    retention: Any = Field(default=None, exclude=True)


class MemoryImportRequest(BaseModel):
    """The body of ``POST /import``, which replaces the caller's memory whole: a document as exported."""

    version: str = "1.0"
    lastUpdated: str = ""
    user: ImportedUserContext = Field(default_factory=ImportedUserContext)
    history: ImportedHistoryContext = Field(default_factory=ImportedHistoryContext)
    facts: list[ImportedFact] = Field(default_factory=list, max_length=MAX_DOCUMENT_FACTS)


class FactCreateRequest(BaseModel):
    content: str = Field(min_length=1, max_length=MAX_FACT_CHARS)
    category: str = Field(default=DEFAULT_CATEGORY, max_length=MAX_CATEGORY_CHARS)
    confidence: float = Field(default=MANUAL_CONFIDENCE, ge=0.0, le=1.0)


class FactPatchRequest(BaseModel):
    """Omitted fields keep their stored value."""

    content: str | None = Field(default=None, min_length=1, max_length=MAX_FACT_CHARS)
    category: str | None = Field(default=None, max_length=MAX_CATEGORY_CHARS)
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)


class MemoryConfigResponse(BaseModel):
    """The settings a client may see; URLs, keys and model names stay server-side."""

    enabled: bool
    storage_path: str
    debounce_seconds: int
    max_facts: int
    fact_confidence_threshold: float
    injection_enabled: bool
    max_injection_tokens: int
    token_counting: str
    guaranteed_categories: list[str]
    guaranteed_token_budget: int


class MemoryStatusResponse(BaseModel):
    config: MemoryConfigResponse
    data: MemoryResponse


class ErrorResponse(BaseModel):
    detail: str


class ValidationErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorResponse(BaseModel):
    """FastAPI's own 422 shape, used for memstore's validation errors too."""

    detail: list[ValidationErrorItem]


_ERRORS: dict[int | str, dict[str, Any]] = {
    422: {"model": ValidationErrorResponse, "description": "Invalid input or user id"},
    503: {
        "model": ErrorResponse,
        "description": "The memory database (or, for a search by meaning, the embeddings endpoint) "
        "is unreachable or refused the request",
    },
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


class _MemoryRoute(APIRoute):
    """Answers every 422 in the documented shape: ``loc``, ``msg`` and ``type`` only.

    FastAPI's own handler echoes each error's ``input`` too. A NaN or a lone surrogate in a body
    cannot be encoded back as JSON, so the 422 for it became a 500, and the echo of a rejected
    megabyte-sized fact doubled the traffic it cost. Doing this in the route keeps it with the
    router whatever app mounts it.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                raise RequestValidationError([_renderable(error) for error in exc.errors()]) from exc

        return handle


def _renderable(error: Mapping[str, Any]) -> dict[str, Any]:
    def text(value: object) -> str:
        return str(value).encode("utf-8", "replace").decode("utf-8")

    return {
        "loc": [part if isinstance(part, int) else text(part) for part in error.get("loc", ())],
        "msg": text(error.get("msg", "")),
        "type": text(error.get("type", "value_error")),
    }


def _memory(document: MemoryDocument, owner: str) -> MemoryResponse:
    facts = document.get("facts")
    if isinstance(facts, list):
        document = {**document, "facts": with_retention(facts, user_id=owner)}
    return MemoryResponse.model_validate(document)


def _config() -> MemoryConfigResponse:
    return MemoryConfigResponse.model_validate(get_memory_config().model_dump())


def create_memory_router(current_user_id: Callable[..., Any], *, prefix: str = "/api/memory") -> APIRouter:
    """The memory endpoints under ``prefix``.

    ``current_user_id`` is a FastAPI dependency (it may itself depend on the request, a token,
    a session...) returning the caller's memstore user id; see ``memstore.make_safe_user_id``
    for mapping external identities.
    """
    router = APIRouter(prefix=prefix, tags=["memory"], route_class=_MemoryRoute)
    Owner = Annotated[str, Depends(current_user_id)]
    document_route: dict[str, Any] = {
        "response_model": MemoryResponse,
        "response_model_exclude_none": True,
        "responses": _ERRORS,
    }

    @router.get("", summary="Get the caller's memory", **document_route)
    def get_memory(owner: Owner) -> MemoryResponse:
        with mapped_errors(owner):
            return _memory(get_memory_data(user_id=owner), owner)

    @router.post("/reload", summary="Re-read the caller's memory from the database", **document_route)
    def reload_memory(owner: Owner) -> MemoryResponse:
        with mapped_errors(owner):
            return _memory(reload_memory_data(user_id=owner), owner)

    @router.delete("", summary="Erase the caller's memory", **document_route)
    def clear_memory(owner: Owner) -> MemoryResponse:
        with mapped_errors(owner):
            return _memory(clear_memory_data(user_id=owner), owner)

    @router.get("/export", summary="Export the caller's memory document", **document_route)
    def export_memory(owner: Owner) -> MemoryResponse:
        with mapped_errors(owner):
            return _memory(get_memory_data(user_id=owner), owner)

    @router.post("/import", summary="Replace the caller's memory with a document", **document_route)
    def import_memory(document: MemoryImportRequest, owner: Owner) -> MemoryResponse:
        with mapped_errors(owner):
            return _memory(import_memory_data(document.model_dump(exclude_none=True), user_id=owner), owner)

    @router.get(
        "/facts",
        summary="Search the caller's facts, best match first",
        response_model=list[Fact],
        response_model_exclude_none=True,
        responses=_ERRORS,
    )
    def search_facts(
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
            Query(description="fulltext (words), semantic (meaning) or hybrid (both, rank-fused)"),
        ] = "fulltext",
    ) -> list[Fact]:
        with mapped_errors(owner):
            found = search_memory_facts(q, category, limit, user_id=owner, mode=mode)
            shown = with_retention(found, user_id=owner)
        return [Fact.model_validate(fact) for fact in shown]

    @router.post(
        "/facts",
        summary="Add a fact to the caller's memory",
        response_model=MemoryResponse,
        response_model_exclude_none=True,
        responses={**_ERRORS, **_CONFLICT},
    )
    def create_fact(request: FactCreateRequest, owner: Owner) -> MemoryResponse:
        with mapped_errors(owner):
            return _memory(
                create_memory_fact(request.content, request.category, request.confidence, user_id=owner),
                owner,
            )

    @router.patch(
        "/facts/{fact_id}",
        summary="Change a fact",
        response_model=MemoryResponse,
        response_model_exclude_none=True,
        responses={**_ERRORS, **_NOT_FOUND, **_CONFLICT},
    )
    def update_fact(fact_id: str, request: FactPatchRequest, owner: Owner) -> MemoryResponse:
        with mapped_errors(owner):
            return _memory(
                update_memory_fact(
                    fact_id,
                    content=request.content,
                    category=request.category,
                    confidence=request.confidence,
                    user_id=owner,
                ),
                owner,
            )

    @router.delete(
        "/facts/{fact_id}",
        summary="Delete a fact",
        response_model=MemoryResponse,
        response_model_exclude_none=True,
        responses={**_ERRORS, **_NOT_FOUND, **_CONFLICT},
    )
    def delete_fact(fact_id: str, owner: Owner) -> MemoryResponse:
        with mapped_errors(owner):
            return _memory(delete_memory_fact(fact_id, user_id=owner), owner)

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
    def memory_status(owner: Owner) -> MemoryStatusResponse:
        with mapped_errors(owner):
            return MemoryStatusResponse(config=_config(), data=_memory(get_memory_data(user_id=owner), owner))

    return router
