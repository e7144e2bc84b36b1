"""Short-term session memory: the shapes every session store and entry point share.

A session is the recent turns of one conversation of a user with an agent, keyed by
``(tenant_id, user_id, agent_name, session_id)``. Turns are numbered by ``seq`` within the
session; compression replaces the oldest ones by one ``system`` turn that summarises them (its
``summary`` flag set), numbered like the last turn it replaced, so the order never changes.
Everything a caller hands in is checked here (``checked_turn``), once for every backend.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from memstore.document import unstorable
from memstore.errors import InvalidScopeError, InvalidTurnError
from memstore.record import nests_deeper
from memstore.scope import DEFAULT_TENANT_ID, normalize_agent_name, validate_tenant_id, validate_user_id

SESSION_ROLES = ("user", "assistant", "system", "tool")
"""The roles a stored turn has; ``system`` only for memstore's own summary."""
APPENDED_ROLES = ("user", "assistant", "tool")
"""The roles a caller may append: a ``system`` turn would come back to the prompt with system
authority, so a session holds none but the summary memstore writes (and escapes)."""
ROLE_ALIASES = {"human": "user", "ai": "assistant"}
"""LangChain's message types, accepted as the roles they are."""
SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_TURN_NAME_CHARS = 128
MAX_TOOL_CALLS_BYTES = 64 * 1024
MAX_TOOL_CALLS_DEPTH = 8
MAX_TURNS_PER_APPEND = 100


def validate_session_id(session_id: object) -> str:
    if not isinstance(session_id, str) or not SESSION_ID_PATTERN.fullmatch(session_id):
        raise InvalidScopeError("Invalid session_id: use 1-128 characters from A-Z a-z 0-9 _ . : -")
    return session_id


@dataclass(frozen=True)
class SessionKey:
    """One session; ``user_id`` and ``agent_name`` may be ``None`` (single-user, no agent)."""

    user_id: str | None
    session_id: str
    agent_name: str | None = None
    tenant_id: str = DEFAULT_TENANT_ID

    def __post_init__(self) -> None:
        validate_tenant_id(self.tenant_id)
        validate_user_id(self.user_id)
        validate_session_id(self.session_id)
        object.__setattr__(self, "agent_name", normalize_agent_name(self.agent_name))


@dataclass(frozen=True)
class SessionTurn:
    """A turn as stored; ``seq`` and ``created_at`` are the store's, ``tokens`` the counter's."""

    role: str
    content: str
    name: str | None = None
    tool_calls: list[Any] | None = None
    seq: int = 0
    created_at: datetime | None = None
    tokens: int = 0
    summary: bool = False

    def as_message(self) -> dict[str, Any]:
        """The turn as an OpenAI-style message (no ``seq``, time or flag)."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls is not None:
            message["tool_calls"] = self.tool_calls
        return message


@dataclass(frozen=True)
class SessionInfo:
    """A session's bookkeeping: raw turns (and their tokens) waiting for compression."""

    key: SessionKey
    turn_count: int
    token_count: int
    compressions: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime
    epoch: str
    """Changes when a session is cleared and started again: a compression read before the clear
    must not remove turns written after it."""
    summary_seq: int | None = None


@dataclass(frozen=True)
class SessionLimits:
    """The caps every backend enforces atomically with the write."""

    max_stored_turns: int
    """Raw turns one session may hold while its compression is pending; more are refused."""
    max_sessions_per_user: int
    ttl_seconds: float


@dataclass(frozen=True)
class AppendResult:
    info: SessionInfo
    turns: list[SessionTurn] = field(default_factory=list)
    """The appended turns with the ``seq`` each got."""


def checked_turn(raw: object, *, max_chars: int) -> SessionTurn:
    """A caller's turn (a mapping with ``role`` and ``content``, optional ``name``, ``tool_calls``)
    as a ``SessionTurn``, or ``InvalidTurnError`` saying what is wrong (never quoting it)."""
    if not isinstance(raw, Mapping):
        raise InvalidTurnError("a turn must be an object with role and content")
    unknown = set(raw) - {"role", "content", "name", "tool_calls"}
    if unknown:
        raise InvalidTurnError(f"a turn takes role, content, name and tool_calls, not {sorted(unknown)[:5]}")
    role = raw.get("role")
    role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
    if role not in APPENDED_ROLES:
        raise InvalidTurnError(f"a turn's role must be one of {', '.join(APPENDED_ROLES)}")
    content = raw.get("content")
    if not isinstance(content, str):
        raise InvalidTurnError("a turn's content must be a string")
    if len(content) > max_chars:
        raise InvalidTurnError(f"a turn's content is {len(content)} characters, over {max_chars}")
    problem = unstorable(content)
    if problem is not None:
        raise InvalidTurnError(f"a turn's content {problem}")
    name = raw.get("name")
    if name is not None and (
        not isinstance(name, str) or not 0 < len(name) <= MAX_TURN_NAME_CHARS or unstorable(name)
    ):
        raise InvalidTurnError(f"a turn's name must be 1-{MAX_TURN_NAME_CHARS} storable characters")
    return SessionTurn(role=role, content=content, name=name, tool_calls=_tool_calls(raw.get("tool_calls")))


def _tool_calls(value: object) -> list[Any] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidTurnError("a turn's tool_calls must be a list")
    if nests_deeper(value, MAX_TOOL_CALLS_DEPTH):
        raise InvalidTurnError(f"a turn's tool_calls nest more than {MAX_TOOL_CALLS_DEPTH} levels")
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidTurnError("a turn's tool_calls must be plain JSON") from exc
    if len(encoded.encode("utf-8", "surrogatepass")) > MAX_TOOL_CALLS_BYTES:
        raise InvalidTurnError(f"a turn's tool_calls are over {MAX_TOOL_CALLS_BYTES} bytes of JSON")
    problem = unstorable(encoded)
    if problem is not None:
        raise InvalidTurnError(f"a turn's tool_calls {problem}")
    parsed: list[Any] = json.loads(encoded)  # a copy: the caller's objects never reach a store
    return parsed


def checked_turns(raw: object, *, max_chars: int) -> list[SessionTurn]:
    if not isinstance(raw, list) or not raw:
        raise InvalidTurnError("turns must be a non-empty list")
    if len(raw) > MAX_TURNS_PER_APPEND:
        raise InvalidTurnError(f"{len(raw)} turns in one append, over the {MAX_TURNS_PER_APPEND} accepted")
    checked = []
    for index, item in enumerate(raw):
        try:
            checked.append(checked_turn(item, max_chars=max_chars))
        except InvalidTurnError as exc:
            raise InvalidTurnError(f"turn {index}: {exc}") from exc
    return checked


def compression_due(info: SessionInfo, *, max_turns: int, max_tokens: int) -> bool:
    """A session is due once its raw turns reach ``session_max_turns`` or ``session_max_tokens``."""
    return info.turn_count >= max_turns or info.token_count >= max_tokens
