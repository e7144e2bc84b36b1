"""The caller named by a header that a trusted reverse proxy sets: one rule for every server.

``memstore serve`` and ``memstore mcp --transport http`` both accept exactly one non-blank copy.
Two copies mean a proxy appended its header instead of replacing the client's, so the client's
own claim would get through; that is refused, never resolved by picking one.
"""

from __future__ import annotations

from collections.abc import Sequence

from memstore.scope import make_safe_user_id


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
