"""Validation of the two parts of a memory scope, shared by every storage provider.

The same rules everywhere mean a scope exported from SQL always has a valid file path
and vice versa, and no id can traverse out of the data directory.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from memstore.errors import InvalidScopeError

USER_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
DEFAULT_USER_ID = "default"
"""The user of a call that names none (``get_effective_user_id``: a single-user deployment).
Reserved: ``make_safe_user_id`` never returns it, so no external identity reaches that scope."""
AGENT_NAME_PATTERN = re.compile(r"^[A-Za-z0-9-]{1,128}$")
DEFAULT_TENANT_ID = "default"
"""The tenant of every call that names none: a single-tenant deployment never says one."""
ROLE_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_ROLES = 32
ADMIN_ROLE = "admin"
"""May read, edit and delete every shared and public fact of its tenant (never another's private)."""
EDITOR_ROLE = "editor"
"""May create shared and public facts (everyone may create private ones)."""

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


def validate_tenant_id(tenant_id: str) -> str:
    """Tenant ids follow the user-id rule (1-128 of A-Z a-z 0-9 _ -): a tenant is never ``''``, so
    a transaction without an identity (``current_setting`` returns ``''`` or NULL) matches none."""
    if not isinstance(tenant_id, str) or not USER_ID_PATTERN.fullmatch(tenant_id):
        raise InvalidScopeError(f"Invalid tenant_id {tenant_id!r}: use 1-128 characters from A-Z a-z 0-9 _ -")
    return tenant_id


def validate_roles(roles: Iterable[str] | None) -> frozenset[str]:
    """At most ``MAX_ROLES`` role names of 1-64 of A-Z a-z 0-9 _ - (no comma: PostgreSQL's policies
    read them back from one comma-separated setting)."""
    if roles is None:
        return frozenset()
    if isinstance(roles, str):
        raise InvalidScopeError("roles must be a list of role names, not one string")
    names = list(roles)
    if len(names) > MAX_ROLES:
        raise InvalidScopeError(f"Too many roles ({len(names)}): at most {MAX_ROLES}")
    for name in names:
        if not isinstance(name, str) or not ROLE_PATTERN.fullmatch(name):
            raise InvalidScopeError(f"Invalid role {name!r}: use 1-64 characters from A-Z a-z 0-9 _ -")
    return frozenset(names)


@dataclass(frozen=True)
class Identity:
    """Who an operation runs for: what it may read and write is decided from these three."""

    tenant_id: str = DEFAULT_TENANT_ID
    user_id: str | None = None
    roles: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls, user_id: str | None, *, tenant_id: str | None = None, roles: Iterable[str] | None = None
    ) -> Identity:
        """A validated identity; ``tenant_id=None`` is the default tenant."""
        return cls(
            validate_tenant_id(DEFAULT_TENANT_ID if tenant_id is None else tenant_id),
            validate_user_id(user_id),
            validate_roles(roles),
        )

    @property
    def roles_setting(self) -> str:
        """The roles as PostgreSQL's ``memstore.roles`` setting holds them: sorted, comma-separated."""
        return ",".join(sorted(self.roles))


DEFAULT_IDENTITY = Identity()


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


_ENCODED_SUFFIX = re.compile(r"-[0-9a-f]{16}\Z")
"""The form of every encoded id; a raw id that already has it is encoded too."""


def make_safe_user_id(raw: str) -> str:
    """Map an external identity (an email, a UUID with braces...) to a valid user id of its own.

    A raw id that is already valid passes through unchanged. Anything else becomes its sanitised
    text (unsafe characters turned into ``-``, cut at 100) plus ``-`` and 16 hex digits of its
    SHA-256, so ``a.b@x`` and ``a-b@x`` land in different scopes. That suffix is reserved: a raw
    id that is valid but already ends like an encoded one (``carol-example-com-e0d47ca1bc1eb62e``,
    which is what ``carol@example.com`` maps to) is encoded as well, so no raw id can map onto
    another's scope. ``DEFAULT_USER_ID`` is reserved too: the raw id ``default`` is encoded
    (``default-37a8eec1ce19687d``), so a caller who says it is ``default`` gets a scope of its own,
    not the memory of every call that named no user. Two different raw ids share an id only if
    their 64-bit digests collide (with the same first 100 characters, sanitised).
    """
    if USER_ID_PATTERN.fullmatch(raw) and raw != DEFAULT_USER_ID and not _ENCODED_SUFFIX.search(raw):
        return raw
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", raw)[:100]
    return f"{safe}-{hashlib.sha256(raw.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def lookup_user_id(raw: str) -> str:
    """The stored id an operator means by ``raw`` (the CLI's ``--user`` on lookups and erase).

    A valid id is taken as the stored id it is: every id memstore prints can be looked up and
    erased. Anything else (an email, an id over 128 characters) is what a gateway passed through
    ``make_safe_user_id``, so it is mapped the same way. This is a lookup, not a write path:
    writers from outside (the gateway, the adapters) always use ``make_safe_user_id``.
    """
    return raw if USER_ID_PATTERN.fullmatch(raw) else make_safe_user_id(raw)


def scope_label(scope: Scope) -> str:
    """A scope as a log line may name it: the agent, never the user (logs are read by people who
    may not read memory, and an id mapped from an email still names the person)."""
    _user_id, agent_name = scope
    return f"agent {agent_name}" if agent_name else "no agent"
