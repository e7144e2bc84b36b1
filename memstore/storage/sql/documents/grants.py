"""A fact's visibility and grants as a memory document states them, checked before any SQL.

A document fact may carry ``"visibility"`` (``private``, ``shared`` or ``public``; absent means
private) and, for a shared fact, ``"allowedUsers"`` and ``"allowedRoles"``. Anything malformed is
refused, never widened or silently dropped: a typo must not make a private fact public.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memstore.document import VISIBILITIES
from memstore.errors import MalformedDocumentError
from memstore.scope import ADMIN_ROLE, EDITOR_ROLE, ROLE_PATTERN, USER_ID_PATTERN

PRIVATE = "private"
SHARED = "shared"
SHARING_ROLES = frozenset({EDITOR_ROLE, ADMIN_ROLE})
"""Either may make a fact shared or public (everyone may keep theirs private)."""
MAX_GRANTS = 100
"""Users, and roles, one shared fact may be granted to (each list)."""
Grants = tuple[tuple[str, str], ...]
"""``(grantee_kind, grantee)`` pairs, sorted: ``("role", "editor")``, ``("user", "bob")``."""


def fact_access(given: Mapping[str, Any]) -> tuple[str, Grants]:
    """The fact's visibility and grants; anything malformed is refused, never widened or dropped."""
    visibility = given.get("visibility", PRIVATE)
    if visibility not in VISIBILITIES:
        raise MalformedDocumentError(
            f"visibility must be one of {', '.join(VISIBILITIES)}, got {visibility!r}"
        )
    grants: set[tuple[str, str]] = set()
    for kind, key, pattern in (
        ("user", "allowedUsers", USER_ID_PATTERN),
        ("role", "allowedRoles", ROLE_PATTERN),
    ):
        names = given.get(key, [])
        if not isinstance(names, list) or len(names) > MAX_GRANTS:
            raise MalformedDocumentError(f"{key} must be a list of at most {MAX_GRANTS} names")
        for name in names:
            if not isinstance(name, str) or not pattern.fullmatch(name):
                raise MalformedDocumentError(f"{key} holds an invalid name: {name!r}")
            grants.add((kind, name))
    if grants and visibility != SHARED:
        raise MalformedDocumentError("allowedUsers and allowedRoles need visibility 'shared'")
    return visibility, tuple(sorted(grants))


def parse_grants(text: str | None) -> Grants:
    """Grants as the cold load and the stored-fact query send them: ``kind:name`` joined by commas.

    Neither part may hold ``:`` or ``,`` (validated on the way in), so the split is exact."""
    if not text:
        return ()
    return tuple(sorted((kind, name) for kind, _, name in (item.partition(":") for item in text.split(","))))
