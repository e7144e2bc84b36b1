"""DeerFlow's user ids as memstore users: one rule for both adapters."""

from __future__ import annotations

from memstore.scope import DEFAULT_USER_ID, make_safe_user_id

DEERFLOW_DEFAULT_USER_ID = "default"
"""DeerFlow's own fallback user (``deerflow.runtime.user_context.DEFAULT_USER_ID``): whom it acts for
when no user is authenticated (a single-user install, its CLI, a background task)."""


def memstore_user_id(user_id: str | None) -> str | None:
    """The memstore user a DeerFlow user id is stored as.

    DeerFlow's fallback user is memstore's fallback user, on purpose: both mean "nobody signed in",
    and that scope is where a single-user DeerFlow's memory has always been stored. The adapters
    are the host's own storage, not an outside caller: DeerFlow decides who ``default`` is before
    memstore sees the id, so ``make_safe_user_id``'s reservation (which keeps callers who merely
    claim the name out of that scope) would only move this memory away. Every other id goes
    through ``make_safe_user_id``.
    """
    if user_id is None:
        return None
    return DEFAULT_USER_ID if user_id == DEERFLOW_DEFAULT_USER_ID else make_safe_user_id(user_id)
