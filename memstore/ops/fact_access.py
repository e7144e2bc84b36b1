"""Who may edit a fact and which access keys it ends up with: the rules ``facts.py`` applies to
updates and deletes (the owner edits its own facts; the tenant's ``admin`` edits another user's
shared or public ones, and never sees that user's private facts)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from memstore.document import MemoryDocument
from memstore.errors import AccessDeniedError
from memstore.ops.fact_search import facts_of
from memstore.ops.validation import access_of, check_may_share, fact_access
from memstore.scope import ADMIN_ROLE, validate_roles, validate_user_id

Visibility = Literal["private", "shared", "public"]
Fact = dict[str, Any]


def new_access(
    current: Fact,
    visibility: Visibility | None,
    allowed_users: Iterable[str] | None,
    allowed_roles: Iterable[str] | None,
    roles: Iterable[str] | None,
) -> dict[str, Any] | None:
    """The fact's access keys after the edit, or ``None`` when the edit leaves them alone.

    An omitted ``visibility`` keeps the current one; an omitted grant list keeps the current grants
    while the fact stays shared and drops them when it does not (grants exist only on shared facts).
    """
    if visibility is None and allowed_users is None and allowed_roles is None:
        return None
    held = access_of(current)
    target = visibility if visibility is not None else held.get("visibility", "private")
    keep = target == "shared"
    access = fact_access(
        target,
        allowed_users if allowed_users is not None else (held.get("allowedUsers") if keep else None),
        allowed_roles if allowed_roles is not None else (held.get("allowedRoles") if keep else None),
    )
    check_may_share(access, roles)
    return access


def without_private(memory: MemoryDocument) -> MemoryDocument:
    """What an admin editing another user's fact gets back: the owner's shared and public facts
    only, never its private facts or summaries."""
    return {"facts": [fact for fact in facts_of(memory) if not is_private(fact)]}


def is_private(fact: Fact) -> bool:
    return bool(access_of(fact).get("visibility", "private") == "private")


def owner_of(
    user_id: str | None, owner_id: str | None, roles: Iterable[str] | None
) -> tuple[str | None, bool]:
    """Whose scope an edit writes, and whether it is the tenant's ``admin`` acting on another
    user's fact. Only ``admin`` may name another owner, and then only a shared or public fact is
    found: another user's private fact stays unseen, as if it did not exist."""
    if owner_id is None or owner_id == user_id:
        return user_id, False
    if ADMIN_ROLE not in validate_roles(roles):
        raise AccessDeniedError("only a fact's owner or the tenant's admin may edit or delete it")
    return validate_user_id(owner_id), True
