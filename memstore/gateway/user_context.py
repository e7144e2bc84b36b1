"""The request's user, held in a ContextVar.

Worker threads do not inherit ContextVars, so producers read the user here at enqueue
time and carry it explicitly; nothing on the worker side calls these functions.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Protocol, runtime_checkable

from memstore.scope import DEFAULT_USER_ID


@runtime_checkable
class CurrentUser(Protocol):
    """Any object with an ``id`` (an ORM user, a JWT claims object, ...)."""

    @property
    def id(self) -> object: ...


_current_user: ContextVar[str | None] = ContextVar("memstore_current_user", default=None)


def set_current_user(user: CurrentUser | str) -> Token[str | None]:
    """Bind the user for the current context; pass the token to ``reset_current_user``."""
    user_id = user if isinstance(user, str) else str(user.id)
    if not user_id:
        raise ValueError("user id must be a non-empty string")
    return _current_user.set(user_id)


def reset_current_user(token: Token[str | None]) -> None:
    _current_user.reset(token)


def get_current_user_id() -> str | None:
    return _current_user.get()


def get_effective_user_id() -> str:
    """The bound user id, or ``"default"`` for single-user deployments; never raises."""
    return _current_user.get() or DEFAULT_USER_ID
