"""Short-term session memory for every entry point: append, read, the prompt's context, clear.

Each call names its session's tenant and user (the entry point's identity); the store keeps to
them (and PostgreSQL's row-level security with it). An append counts each turn's tokens, stores
the turns atomically with the caps, and, once the session is due (``session_max_turns`` raw turns
or ``session_max_tokens``), hands it to the queue as a ``session_compress`` job: compression runs
on a queue worker, never on the request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from memstore.capture.conversation import SESSION_COMPRESS, ConversationContext
from memstore.config import MemoryConfig, get_memory_config
from memstore.document import format_timestamp
from memstore.inject.session_context import SessionContext, build_session_context
from memstore.inject.tokens import count_tokens
from memstore.queue.process import get_memory_queue, queue_failure
from memstore.scope import DEFAULT_TENANT_ID
from memstore.session import (
    AppendResult,
    SessionInfo,
    SessionKey,
    SessionLimits,
    SessionTurn,
    checked_turns,
    compression_due,
)
from memstore.storage.sessions.loader import get_session_store

logger = logging.getLogger(__name__)

MAX_LIST_LIMIT = 1000


def session_limits(config: MemoryConfig) -> SessionLimits:
    return SessionLimits(
        max_stored_turns=config.session_max_stored_turns,
        max_sessions_per_user=config.session_max_per_user,
        ttl_seconds=config.session_ttl_seconds,
    )


def _counted(turn: SessionTurn, use_tiktoken: bool) -> SessionTurn:
    text = turn.content
    if turn.tool_calls is not None:
        text += json.dumps(turn.tool_calls, ensure_ascii=False)
    return replace(turn, tokens=count_tokens(text, use_tiktoken=use_tiktoken))


def append_turns(
    user_id: str | None,
    session_id: str,
    turns: Sequence[Mapping[str, Any]],
    *,
    agent_name: str | None = None,
    tenant_id: str = DEFAULT_TENANT_ID,
) -> AppendResult:
    """Store ``turns`` (``role``, ``content``, optional ``name`` and ``tool_calls``) after the
    session's last; raises ``InvalidTurnError``, ``InvalidScopeError`` or ``SessionLimitError``
    (nothing stored) and ``SessionStoreUnavailableError``."""
    config = get_memory_config()
    key = SessionKey(user_id, session_id, agent_name, tenant_id)
    use_tiktoken = config.token_counting == "tiktoken"
    checked = [
        _counted(turn, use_tiktoken)
        for turn in checked_turns(
            list(turns) if isinstance(turns, list | tuple) else turns, max_chars=config.session_max_turn_chars
        )
    ]
    result = get_session_store(config).append(
        key, checked, now=datetime.now(UTC), limits=session_limits(config)
    )
    if compression_due(result.info, max_turns=config.session_max_turns, max_tokens=config.session_max_tokens):
        request_compression(key)
    return result


def request_compression(key: SessionKey) -> None:
    """Queue the session's compression; a failure is logged, and the next append asks again."""
    try:
        get_memory_queue().submit(
            ConversationContext(
                key.session_id,
                [],
                key.agent_name,
                key.user_id,
                tenant_id=key.tenant_id,
                kind=SESSION_COMPRESS,
            ),
            immediately=True,
        )
    except Exception as exc:
        logger.warning(
            "session compression could not be queued (the next append asks again): %s", queue_failure(exc)
        )


def read_session(
    user_id: str | None, session_id: str, *, agent_name: str | None = None, tenant_id: str = DEFAULT_TENANT_ID
) -> tuple[SessionInfo | None, list[SessionTurn]]:
    key = SessionKey(user_id, session_id, agent_name, tenant_id)
    return get_session_store().read(key, now=datetime.now(UTC))


def session_context(
    user_id: str | None,
    session_id: str,
    *,
    agent_name: str | None = None,
    tenant_id: str = DEFAULT_TENANT_ID,
    max_tokens: int | None = None,
) -> SessionContext:
    """The session's summary and its most recent turns within ``max_tokens`` (default
    ``session_context_max_tokens``), as messages for the next prompt; empty for no session."""
    config = get_memory_config()
    _, turns = read_session(user_id, session_id, agent_name=agent_name, tenant_id=tenant_id)
    budget = config.session_context_max_tokens if max_tokens is None else max_tokens
    return build_session_context(turns, max_tokens=budget, use_tiktoken=config.token_counting == "tiktoken")


def clear_session(
    user_id: str | None, session_id: str, *, agent_name: str | None = None, tenant_id: str = DEFAULT_TENANT_ID
) -> bool:
    return get_session_store().clear(SessionKey(user_id, session_id, agent_name, tenant_id))


def list_sessions(
    user_id: str | None, *, tenant_id: str = DEFAULT_TENANT_ID, limit: int = 100, offset: int = 0
) -> list[SessionInfo]:
    SessionKey(user_id, "list", None, tenant_id)  # validates the ids
    limit = max(1, min(limit, MAX_LIST_LIMIT))
    return get_session_store().list_sessions(
        tenant_id, user_id, now=datetime.now(UTC), limit=limit, offset=max(0, offset)
    )


def erase_user_sessions(user_id: str, *, tenant_id: str = DEFAULT_TENANT_ID) -> int:
    return get_session_store().erase_user(tenant_id, user_id)


def expire_sessions(now: datetime | None = None) -> int:
    """Delete the sessions past ``session_ttl_seconds`` (the lifecycle run calls it)."""
    return get_session_store().expire(now or datetime.now(UTC))


def info_dict(info: SessionInfo) -> dict[str, Any]:
    """A session's bookkeeping as JSON for the HTTP API, MCP and the CLI."""
    return {
        "sessionId": info.key.session_id,
        "userId": info.key.user_id,
        "agentName": info.key.agent_name,
        "tenantId": info.key.tenant_id,
        "turnCount": info.turn_count,
        "tokenCount": info.token_count,
        "compressions": info.compressions,
        "createdAt": format_timestamp(info.created_at),
        "updatedAt": format_timestamp(info.updated_at),
        "expiresAt": format_timestamp(info.expires_at),
    }


def turn_dict(turn: SessionTurn) -> dict[str, Any]:
    return {
        **turn.as_message(),
        "seq": turn.seq,
        "summary": turn.summary,
        "tokens": turn.tokens,
        "createdAt": format_timestamp(turn.created_at) if turn.created_at else None,
    }
