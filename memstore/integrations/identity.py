"""The caller named by headers that a trusted reverse proxy sets: one rule for every server.

``memstore serve`` and ``memstore mcp --transport http`` both accept exactly one non-blank copy
of the user and tenant headers. Two copies mean a proxy appended its header instead of replacing
the client's, so the client's own claim would get through; that is refused, never resolved by
picking one. The roles header is one comma-separated list (at most one copy; none means no
roles). A tenant is taken as typed, never mapped: an invalid one is a 400, not another tenant.
"""

from __future__ import annotations

from collections.abc import Sequence

from memstore.errors import InvalidScopeError
from memstore.scope import make_safe_user_id, validate_roles, validate_tenant_id


class IdentityHeaderError(Exception):
    """The identity header is missing or repeated; ``status_code`` is the HTTP answer to give."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


def user_from_header(name: str, copies: Sequence[str]) -> str:
    """The memstore user id for the one value of header ``name`` (through ``make_safe_user_id``)."""
    if len(copies) > 1:
        raise IdentityHeaderError(400, f"{name} header sent {len(copies)} times; expected exactly one")
    raw = copies[0].strip() if copies else ""
    if not raw:
        raise IdentityHeaderError(401, f"missing {name} header")
    return make_safe_user_id(raw)


def tenant_from_header(name: str, copies: Sequence[str]) -> str:
    """The tenant id in the one value of header ``name``; missing is a 401, invalid a 400."""
    if len(copies) > 1:
        raise IdentityHeaderError(400, f"{name} header sent {len(copies)} times; expected exactly one")
    raw = copies[0].strip() if copies else ""
    if not raw:
        raise IdentityHeaderError(401, f"missing {name} header")
    try:
        return validate_tenant_id(raw)
    except InvalidScopeError as exc:
        raise IdentityHeaderError(400, f"{name} header: {exc}") from exc


def roles_from_header(name: str, copies: Sequence[str]) -> frozenset[str]:
    """The roles in header ``name`` (``editor,admin``); absent or blank is none, invalid a 400."""
    if len(copies) > 1:
        raise IdentityHeaderError(400, f"{name} header sent {len(copies)} times; expected at most one")
    names = [part.strip() for part in copies[0].split(",")] if copies else []
    try:
        return validate_roles([part for part in names if part])
    except InvalidScopeError as exc:
        raise IdentityHeaderError(400, f"{name} header: {exc}") from exc
