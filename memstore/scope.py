"""Validation of the two parts of a memory scope, shared by every storage provider.

The same rules everywhere mean a scope exported from SQL always has a valid file path
and vice versa, and no id can traverse out of the data directory.
"""

from __future__ import annotations

import hashlib
import re

from memstore.errors import InvalidScopeError

USER_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
AGENT_NAME_PATTERN = re.compile(r"^[A-Za-z0-9-]{1,128}$")

Scope = tuple[str | None, str | None]


def validate_user_id(user_id: str | None) -> str | None:
    if user_id is None:
        return None
    if not isinstance(user_id, str) or not USER_ID_PATTERN.fullmatch(user_id):
        raise InvalidScopeError(
            f"Invalid user_id {user_id!r}: use 1-128 characters from A-Z a-z 0-9 _ - "
            "(normalise external ids with make_safe_user_id)"
        )
    return user_id


def normalize_agent_name(agent_name: str | None) -> str | None:
    """Validate an agent name and lower-case it: agent names compare case-insensitively."""
    if agent_name is None:
        return None
    if not isinstance(agent_name, str) or not AGENT_NAME_PATTERN.fullmatch(agent_name):
        raise InvalidScopeError(f"Invalid agent_name {agent_name!r}: use 1-128 characters from A-Z a-z 0-9 -")
    return agent_name.lower()


def resolve_scope(agent_name: str | None, user_id: str | None) -> Scope:
    """Validated ``(user_id, agent_name)`` key used by caches and queries."""
    return validate_user_id(user_id), normalize_agent_name(agent_name)


def make_safe_user_id(raw: str) -> str:
    """Map an external identity (an email, a UUID with braces...) to a valid, collision-free id.

    Unsafe characters become ``-``; when anything changed, a hash suffix keeps two raw ids
    that sanitise alike (``a.b@x`` and ``a-b@x``) in different scopes.
    """
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", raw)[:100]
    if safe != raw or not safe:
        safe = f"{safe}-{hashlib.sha256(raw.encode('utf-8')).hexdigest()[:16]}"
    return safe
