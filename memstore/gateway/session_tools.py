"""Tool mode for short-term session memory: append a conversation's turns, read them back as the
next prompt's context, list and clear sessions.

As ``gateway.tools``: plain callables returning a JSON object string, never raising; a failure is
``{"error": ...}`` from the same ``_error`` (an invalid turn names the rule it breaks and never
quotes it; a write past a cap adds ``limit``: ``turns`` or ``sessions``). The scope keywords
(``user_id``, ``agent_name``, ``tenant_id``) are the server's to set, never the model's; by
default the request's user and tenant (``set_current_user``) and no agent.
"""

from __future__ import annotations

from typing import Any

from memstore.gateway.tools import _error, _result
from memstore.gateway.user_context import effective_tenant, get_effective_user_id
from memstore.ops import sessions
from memstore.ops.sessions import MAX_LIST_LIMIT, info_dict

MAX_CONTEXT_TOKENS = 100_000
"""The largest ``max_tokens`` of a session's context (the bound of ``session_context_max_tokens``)."""
MAX_LIST_OFFSET = 1_000_000
"""The most sessions a user can have (the bound of ``session_max_per_user``): no page starts later."""


def session_append(
    session_id: str,
    turns: list[dict[str, Any]],
    *,
    user_id: str | None = None,
    agent_name: str | None = None,
    tenant_id: str | None = None,
) -> str:
    """Remember the latest turns of this conversation (short-term memory), oldest first.

    Args:
        session_id: The conversation's id: 1-128 characters from A-Z a-z 0-9 _ . : -
        turns: Up to 100 messages, each {"role": "user" | "assistant" | "system" | "tool",
            "content": "..."}, with "name" and "tool_calls" when the message has them.
    """
    owner = user_id or get_effective_user_id()
    try:
        if not isinstance(turns, list):
            return _result({"error": "turns must be a non-empty list"})
        appended = sessions.append_turns(
            owner, session_id, turns, agent_name=agent_name, tenant_id=effective_tenant(tenant_id)
        )
    except Exception as exc:
        return _error(exc, owner)
    return _result({"session": info_dict(appended.info), "appended": [turn.seq for turn in appended.turns]})


def session_context(
    session_id: str,
    max_tokens: int | None = None,
    *,
    user_id: str | None = None,
    agent_name: str | None = None,
    tenant_id: str | None = None,
) -> str:
    """This conversation so far, ready for your prompt: a summary of its older part (if any), then
    its most recent turns, oldest first. Empty for a conversation not stored (or expired).

    Args:
        session_id: The conversation's id, as given to session_append.
        max_tokens: The token budget for the summary and turns (default: the server's setting).
    """
    owner = user_id or get_effective_user_id()
    if max_tokens is not None and not 1 <= max_tokens <= MAX_CONTEXT_TOKENS:
        return _result({"error": f"max_tokens must be from 1 to {MAX_CONTEXT_TOKENS}"})
    try:
        tenant = effective_tenant(tenant_id)
        context = sessions.session_context(
            owner, session_id, agent_name=agent_name, tenant_id=tenant, max_tokens=max_tokens
        )
    except Exception as exc:
        return _error(exc, owner)
    return _result(
        {
            "messages": context.messages,
            "summary": context.summary,
            "omitted": context.omitted,
            "tokens": context.tokens,
        }
    )


def session_clear(
    session_id: str,
    *,
    user_id: str | None = None,
    agent_name: str | None = None,
    tenant_id: str | None = None,
) -> str:
    """Forget this conversation's short-term memory: its turns and summary.

    Args:
        session_id: The conversation's id, as given to session_append.
    """
    owner = user_id or get_effective_user_id()
    try:
        cleared = sessions.clear_session(
            owner, session_id, agent_name=agent_name, tenant_id=effective_tenant(tenant_id)
        )
    except Exception as exc:
        return _error(exc, owner)
    return _result({"session_id": session_id, "cleared": cleared})


def session_list(
    limit: int = 20,
    offset: int = 0,
    *,
    user_id: str | None = None,
    tenant_id: str | None = None,
) -> str:
    """The user's stored conversations (with every agent), the most recently active first.

    Args:
        limit: Maximum number of sessions to return.
        offset: Sessions to skip, for paging.
    """
    owner = user_id or get_effective_user_id()
    if not 1 <= limit <= MAX_LIST_LIMIT or not 0 <= offset <= MAX_LIST_OFFSET:
        return _result(
            {"error": f"limit must be from 1 to {MAX_LIST_LIMIT}, offset from 0 to {MAX_LIST_OFFSET}"}
        )
    try:
        tenant = effective_tenant(tenant_id)
        found = sessions.list_sessions(owner, tenant_id=tenant, limit=limit, offset=offset)
    except Exception as exc:
        return _error(exc, owner)
    return _result({"sessions": [info_dict(info) for info in found], "count": len(found)})
