"""DeerFlow's user ids as memstore users: one rule for both adapters.

DeerFlow normalises an identity before its storage sees it (``deerflow.config.paths.make_safe_user_id``
and DeerMem's ``safe_user_id``, one rule; its IM channels, its auth boundary and the
``/api/memory`` owner header all use it): an id made only of ``A-Z a-z 0-9 _ -`` is kept, any
other becomes that text with every other character turned into ``-``, then ``-`` and the first 16
hex digits of its UTF-8 SHA-256, with no length cap. DeerMem's files apply the rule once more on
the way in, so a raw id and its normalised form are one DeerFlow user.

That is memstore's own ``make_safe_user_id`` for identities up to 100 characters, so a DeerFlow id
such as ``alice-example-com-ff8d9819fc0e12bf`` is stored as it is: one scope, which
``memstore show --user`` finds by DeerFlow's id or by ``alice@example.com``. memstore's rule
encodes a raw id of that shape again, to keep outside callers out of the scope of the identity it
names; the adapters must not, since DeerFlow has already decided who the user is (including its
own fallback user ``default``, which is memstore's fallback scope: both mean nobody signed in).

What stays injective. Ids DeerFlow can hand over are unbounded, memstore's are 128 characters at
most, so the adapters keep every DeerFlow id that memstore can store, except those of the shape
``make_safe_user_id`` gives an id it shortens (exactly 100 characters, ``-``, 16 hex digits), and
pass those and every longer id through ``make_safe_user_id``, which lands them in that shape. Kept
ids never have it, so two DeerFlow users share a scope only if two 64-bit digests collide, as in
``make_safe_user_id``. An id longer than 128 characters is found by ``--user`` with DeerFlow's id
(the CLI maps it the same way); one of the reserved shape (an identity of exactly 100 characters)
is stored under ``memstore_user_id(id)``, which ``memstore facts list`` shows.
"""

from __future__ import annotations

import hashlib
import re

from memstore.errors import InvalidScopeError
from memstore.scope import USER_ID_PATTERN, make_safe_user_id

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_SHORTENED = re.compile(r"[A-Za-z0-9_-]{100}-[0-9a-f]{16}")
"""What ``make_safe_user_id`` makes of an id it cuts: 100 characters, ``-``, 16 hex digits."""


class DeerFlowUserError(InvalidScopeError, ValueError):
    """A user id the adapters refuse: empty, or missing under DeerMem's ``strict_user_scope``.

    A ``ValueError`` too: that is what DeerFlow's own storage raises there, and what its callers catch.
    """


def deerflow_user_id(raw: str) -> str:
    """The DeerFlow user ``raw`` is: DeerFlow's normalisation, which is idempotent."""
    if not raw:
        raise DeerFlowUserError("user_id must be a non-empty string")
    safe = _UNSAFE.sub("-", raw)
    if safe == raw:
        return raw
    return f"{safe}-{hashlib.sha256(raw.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def memstore_user_id(user_id: str | None) -> str | None:
    """The memstore user a DeerFlow user id is stored as (None stays None: the legacy global scope)."""
    if user_id is None:
        return None
    deerflow_id = deerflow_user_id(user_id)
    if USER_ID_PATTERN.fullmatch(deerflow_id) and not _SHORTENED.fullmatch(deerflow_id):
        return deerflow_id
    return make_safe_user_id(deerflow_id)
