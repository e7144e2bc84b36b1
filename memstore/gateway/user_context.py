"""The request's identity (user, tenant, roles), held in a ContextVar.

Worker threads do not inherit ContextVars, so producers read the identity here at enqueue
time and carry it explicitly; nothing on the worker side calls these functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from memstore.scope import DEFAULT_TENANT_ID, DEFAULT_USER_ID, Identity, validate_roles, validate_tenant_id


@runtime_checkable
class CurrentUser(Protocol):
    """Any object with an ``id`` (an ORM user, a JWT claims object, ...)."""

    @property
    def id(self) -> object: ...


@dataclass(frozen=True)
class _Binding:
    user_id: str
    tenant_id: str
    roles: frozenset[str]


_current: ContextVar[_Binding | None] = ContextVar("memstore_current_user", default=None)


def set_current_user(
    user: CurrentUser | str, tenant_id: str | None = None, roles: Iterable[str] | None = None
) -> Token[_Binding | None]:
    """Bind the user (and its tenant and roles) for the current context; pass the token to
    ``reset_current_user``. The tenant and roles are validated here, so a bad one fails at the
    request's edge; the user id is validated where it is used, as before."""
    user_id = user if isinstance(user, str) else str(user.id)
    if not user_id:
        raise ValueError("user id must be a non-empty string")
    tenant = validate_tenant_id(DEFAULT_TENANT_ID if tenant_id is None else tenant_id)
    return _current.set(_Binding(user_id, tenant, validate_roles(roles)))


def reset_current_user(token: Token[_Binding | None]) -> None:
    _current.reset(token)


def get_current_user_id() -> str | None:
    binding = _current.get()
    return binding.user_id if binding is not None else None


def get_effective_user_id() -> str:
    """The bound user id, or ``"default"`` for single-user deployments; never raises."""
    return get_current_user_id() or DEFAULT_USER_ID


def get_current_identity() -> Identity:
    """The bound identity; unbound, the default tenant with no user and no roles."""
    binding = _current.get()
    if binding is None:
        return Identity()
    # Not Identity.of: the user id is validated where it is used (an invalid one is a 422 there).
    return Identity(binding.tenant_id, binding.user_id, binding.roles)


def effective_tenant(tenant_id: str | None) -> str:
    """``tenant_id`` when given, else the bound tenant (the default one when nothing is bound)."""
    return tenant_id if tenant_id is not None else get_current_identity().tenant_id


def effective_roles(roles: Iterable[str] | None) -> frozenset[str]:
    """``roles`` when given (validated), else the bound roles."""
    return validate_roles(roles) if roles is not None else get_current_identity().roles
