"""The request and response models of ``/api/memory`` (``integrations.fastapi``), apart from its routes.

Request models carry the core's size caps (``memstore.document``, ``memstore.session``), so an
oversized fact, summary, import or append is a 422 before it reaches storage.
"""

# No ``from __future__ import annotations``: pydantic and FastAPI evaluate these annotations.

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memstore.document import (
    DEFAULT_CATEGORY,
    MANUAL_CONFIDENCE,
    MAX_CATEGORY_CHARS,
    MAX_DOCUMENT_FACTS,
    MAX_FACT_CHARS,
    MAX_SUMMARY_CHARS,
)
from memstore.ops.record_fields import MemoryType, SourceKind
from memstore.ops.validation import MAX_GRANTS
from memstore.record import MAX_RAW_CHARS, MAX_TAGS
from memstore.session import MAX_TOOL_CALLS_BYTES, MAX_TURN_NAME_CHARS, MAX_TURNS_PER_APPEND


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
    decay: float | None = Field(
        default=None, description="decay score now: confidence x max(freshness, heat), importance-stretched"
    )


class FactRelation(BaseModel):
    """This fact is ``type`` (related_to, supersedes, derived_from, contradicts) to fact ``target``
    of the same memory."""

    type: str
    target: str


class Fact(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    content: str
    category: str = DEFAULT_CATEGORY
    confidence: float = 0.5
    createdAt: str = ""
    source: str = "unknown"
    sourceError: str | None = None
    # The memory record (docs/schema.md): present only when the fact sets a value other than the
    # default, so a DeerFlow fact reads as before. Plain types: a response shows what is stored.
    type: str | None = Field(
        default=None,
        description="episodic, semantic, procedural, preference or profile; default: the category's",
    )
    importance: float | None = Field(default=None, description="0 to 1; default 0.5")
    tags: list[str] | None = Field(default=None, description="Default: none")
    sourceKind: str | None = Field(
        default=None,
        description="explicit_user_input, implicit_inference (the default), system_generated, "
        "external_data or corrected_memory",
    )
    raw: str | None = Field(default=None, description="The user's words the fact came from")
    structured: dict[str, Any] | None = Field(default=None, description="The fact as a JSON object")
    relations: list[FactRelation] | None = Field(default=None, description="Relations to other facts")
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
    # The record keys as sent (no coercion: "0.7" is not an importance), for the import's own
    # check (ops.validation.check_document), whose 422 names the fact and the key.
    type: Any = None
    importance: Any = None
    tags: Any = None
    sourceKind: Any = None
    raw: Any = None
    structured: Any = None
    relations: Any = None
    # Read-only: accepted (an export imports again) and dropped.
    retention: Any = Field(default=None, exclude=True)


class MemoryImportRequest(BaseModel):
    """The body of ``POST /import``, which replaces the caller's memory whole: a document as exported."""

    version: str = "1.0"
    lastUpdated: str = ""
    user: ImportedUserContext = Field(default_factory=ImportedUserContext)
    history: ImportedHistoryContext = Field(default_factory=ImportedHistoryContext)
    facts: list[ImportedFact] = Field(default_factory=list, max_length=MAX_DOCUMENT_FACTS)


Visibility = Literal["private", "shared", "public"]


class FactCreateRequest(BaseModel):
    content: str = Field(min_length=1, max_length=MAX_FACT_CHARS)
    category: str = Field(default=DEFAULT_CATEGORY, max_length=MAX_CATEGORY_CHARS)
    confidence: float = Field(default=MANUAL_CONFIDENCE, ge=0.0, le=1.0)
    visibility: Visibility = Field(
        default="private", description="shared and public need the role editor or admin"
    )
    allowed_users: list[str] | None = Field(
        default=None, max_length=MAX_GRANTS, description="With visibility shared: users who may read it"
    )
    allowed_roles: list[str] | None = Field(
        default=None, max_length=MAX_GRANTS, description="With visibility shared: roles that may read it"
    )
    memory_type: MemoryType | None = Field(default=None, description="Default: the category's type")
    importance: float | None = Field(default=None, ge=0.0, le=1.0, description="0 to 1; default 0.5")
    tags: list[str] | None = Field(default=None, max_length=MAX_TAGS, description="Short labels")
    source_kind: SourceKind | None = Field(default=None, description="Default: implicit_inference")
    raw: str | None = Field(
        default=None, max_length=MAX_RAW_CHARS, description="The user's words the fact came from"
    )
    structured: dict[str, Any] | None = Field(default=None, description="The fact as a JSON object")


class FactPatchRequest(BaseModel):
    """Omitted fields keep their stored value (grants are dropped when the fact stops being shared);
    ``tags: []``, ``raw: ""`` and ``structured: {}`` remove those fields."""

    content: str | None = Field(default=None, min_length=1, max_length=MAX_FACT_CHARS)
    category: str | None = Field(default=None, max_length=MAX_CATEGORY_CHARS)
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    visibility: Visibility | None = None
    allowed_users: list[str] | None = Field(default=None, max_length=MAX_GRANTS)
    allowed_roles: list[str] | None = Field(default=None, max_length=MAX_GRANTS)
    memory_type: MemoryType | None = Field(default=None, description="Default: the category's type")
    importance: float | None = Field(default=None, ge=0.0, le=1.0, description="0 to 1; default 0.5")
    tags: list[str] | None = Field(default=None, max_length=MAX_TAGS, description="Short labels")
    source_kind: SourceKind | None = Field(default=None, description="Default: implicit_inference")
    raw: str | None = Field(
        default=None, max_length=MAX_RAW_CHARS, description="The user's words the fact came from"
    )
    structured: dict[str, Any] | None = Field(default=None, description="The fact as a JSON object")


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


# -- sessions (short-term memory): ``integrations.fastapi_sessions`` ----------------------------


class SessionTurnRequest(BaseModel):
    """One turn to append, as an OpenAI-style message. The content's cap is the setting
    ``session_max_turn_chars``, checked on append with the role and the tool calls (a 422 naming
    the rule); the request body as a whole is capped by ``MAX_APPEND_BODY_BYTES``."""

    model_config = ConfigDict(extra="forbid")

    role: str = Field(
        max_length=16,
        description="user, assistant, system or tool (LangChain's human and ai: user and assistant)",
    )
    content: str = Field(description="The message text (at most session_max_turn_chars characters)")
    name: str | None = Field(default=None, max_length=MAX_TURN_NAME_CHARS, description="The speaker or tool")
    tool_calls: list[Any] | None = Field(
        default=None,
        description=f"The assistant's tool calls: plain JSON, {MAX_TOOL_CALLS_BYTES} bytes at most",
    )


class SessionAppendRequest(BaseModel):
    """The body of ``POST /sessions/{session_id}/turns``: turns, oldest first, stored all or none."""

    model_config = ConfigDict(extra="forbid")

    turns: list[SessionTurnRequest] = Field(min_length=1, max_length=MAX_TURNS_PER_APPEND)


class SessionInfoResponse(BaseModel):
    """A session's bookkeeping: its raw turns (and their tokens) not yet compressed into the summary."""

    sessionId: str
    userId: str | None
    agentName: str | None
    tenantId: str
    turnCount: int = Field(description="Raw turns stored (the summary is not counted)")
    tokenCount: int = Field(description="Tokens of the raw turns")
    compressions: int = Field(description="Times older turns were replaced by the summary")
    createdAt: str
    updatedAt: str
    expiresAt: str = Field(description="The session expires unless appended to before then")


class SessionTurnResponse(BaseModel):
    """A stored turn: the message (``name`` and ``tool_calls`` only when set) and the store's fields."""

    role: str
    content: str
    name: str | None = None
    tool_calls: list[Any] | None = None
    seq: int = Field(description="Its number in the session, increasing")
    summary: bool = Field(description="The system turn summarising the turns up to its seq")
    tokens: int
    createdAt: str | None = None


class SessionResponse(BaseModel):
    session: SessionInfoResponse
    turns: list[SessionTurnResponse] = Field(
        description="GET: every stored turn, the summary first; POST: the turns just appended"
    )


class SessionListResponse(BaseModel):
    sessions: list[SessionInfoResponse] = Field(description="The most recently active first")
    limit: int
    offset: int


class SessionClearedResponse(BaseModel):
    sessionId: str
    cleared: bool = Field(description="Always true: a session that was not there is a 404")


class SessionContextResponse(BaseModel):
    """What the next prompt takes from the session (``memstore.inject.session_context``)."""

    messages: list[dict[str, Any]] = Field(
        description="Oldest first: the summary as a system message (if any), then the newest turns that fit"
    )
    summary: str | None
    omitted: int = Field(description="Older raw turns left out by the token budget")
    tokens: int


# -- the agents' own documents: ``integrations.fastapi_agent_docs`` -----------------------------


class AgentDocumentResponse(BaseModel):
    """A live document of the agent; ``content`` is left out of listings."""

    path: str = Field(description="Its virtual path, such as /memories/agent.md")
    version: int = Field(description="Bumped by every write; pass it as expected_version to change this one")
    chars: int
    author: str = Field(description="Who wrote this version: agent, user, operator or import")
    actor: str | None = Field(description="The user whose request wrote it (none for the CLI or an import)")
    updatedAt: str
    content: str | None = Field(default=None, description="The whole text (not in listings)")


class AgentDocumentListResponse(BaseModel):
    agentName: str
    documents: list[AgentDocumentResponse] = Field(description="By path, without their text")


class AgentDocumentWriteRequest(BaseModel):
    """The body of ``PUT .../document``: the whole new text. The content's cap is the setting
    ``agent_doc_max_chars`` (a 422 naming it); the body as a whole is capped at 8 MiB (a 413)."""

    model_config = ConfigDict(extra="forbid")

    content: str = Field(description="The whole new text, Markdown")
    expected_version: int | None = Field(
        strict=True,
        ge=0,
        description="Required: 0 creates the document only if there is none; n replaces version n only; "
        "null replaces whatever is stored",
    )


class AgentDocumentEditRequest(BaseModel):
    """The body of ``PATCH .../document``: replace ``old_string``, which must occur exactly once."""

    model_config = ConfigDict(extra="forbid")

    old_string: str = Field(min_length=1, description="The exact text to replace; it must occur once")
    new_string: str = Field(description="Its replacement (empty removes it)")
    expected_version: int | None = Field(
        default=None, strict=True, ge=1, description="Edit only this version (default: whatever is stored)"
    )


class AgentDocumentDeletedResponse(BaseModel):
    path: str
    version: int = Field(description="The version the deletion recorded in the history")
    deleted: bool = Field(description="Always true: a document that was not there is a 404")


class AgentDocumentVersionResponse(BaseModel):
    path: str
    version: int
    action: str = Field(description="write, edit or delete")
    author: str = Field(description="agent, user, operator or import")
    actor: str | None
    createdAt: str
    content: str | None = Field(description="The text this version left (null for a deletion)")


class AgentDocumentHistoryResponse(BaseModel):
    versions: list[AgentDocumentVersionResponse] = Field(description="Newest first")
    limit: int
    offset: int


class AgentDocumentConflictResponse(BaseModel):
    """A 409: the document is not at the version the request expected; nothing was stored."""

    detail: str
    expected: int = Field(description="The version the request expected (0: none)")
    current: int = Field(description="The version stored now (0: no live document)")
