"""What the queue may hold: a number of conversations and a number of characters.

``max_queue_depth`` caps the conversations; corrections may go beyond it by a reserve of a
tenth of it (at least one), and no further, so a stream of "try again" turns cannot grow the
queue without bound. ``max_queue_chars`` caps the characters of every conversation the queue
holds, pending or in the batch being processed, whatever its flags: it is the memory bound.
It holds because the queue keeps each conversation as text only, trimmed to its newest
``MAX_QUEUED_CONVERSATION_CHARS``: no image or payload rides along uncounted. A turn past a bound
is dropped with a warning (a newer turn of a queued conversation too: the older one stays).
Admitted corrections are processed like any other turn; the reserve only decides admission.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from memstore.capture.conversation import ConversationKey
from memstore.capture.message_access import message_text
from memstore.config import MemoryConfig
from memstore.storage.sql.queue.limits import QueueLimits, TenantLimits

MAX_QUEUED_MESSAGE_CHARS = 8_000
MAX_QUEUED_CONVERSATION_CHARS = 64_000
"""Per-message and per-conversation caps applied at enqueue; the prompt cuts much shorter anyway."""
MAX_QUEUED_MESSAGES = 400
"""The newest this many non-empty messages of a conversation are queued (the database queue)."""
CORRECTION_RESERVE_DIVISOR = 10
"""Corrections may use ``max_queue_depth // CORRECTION_RESERVE_DIVISOR`` (at least 1) extra slots."""


def correction_reserve(depth: int) -> int:
    return max(1, depth // CORRECTION_RESERVE_DIVISOR)


def table_limits(config: MemoryConfig) -> QueueLimits:
    """The database queue's bounds: ``max_queue_depth`` and ``max_queue_chars`` in total,
    ``queue_tenant_share`` of each per tenant and ``queue_user_share`` per user (each share at
    least one conversation of the largest size)."""
    depth, chars = config.max_queue_depth, config.max_queue_chars
    user_depth, user_chars = _share(depth, chars, config.queue_user_share)
    tenant = None
    if config.queue_tenant_share < 1.0:
        tenant_depth, tenant_chars = _share(depth, chars, config.queue_tenant_share)
        tenant = TenantLimits(tenant_depth, tenant_depth + correction_reserve(tenant_depth), tenant_chars)
    return QueueLimits(
        depth=depth,
        depth_corrections=depth + correction_reserve(depth),
        chars=chars,
        user_depth=user_depth,
        user_depth_corrections=user_depth + correction_reserve(user_depth),
        user_chars=user_chars,
        tenant=tenant,
    )


def _share(depth: int, chars: int, share: float) -> tuple[int, int]:
    return max(1, math.floor(depth * share)), max(MAX_QUEUED_CONVERSATION_CHARS, math.floor(chars * share))


def conversation_chars(messages: Sequence[Any]) -> int:
    """The characters of text a queued conversation holds (what ``bound_conversation`` counts)."""
    return sum(len(message_text(message)) for message in messages)


class QueueBudget:
    """Characters held per pending key, plus the batch in flight; the queue calls it under its lock."""

    def __init__(self) -> None:
        self._pending: dict[ConversationKey, int] = {}
        self._pending_total = 0
        self._in_flight = 0

    @property
    def held(self) -> int:
        """Characters pending or being processed (a retry counts twice until its batch ends: safe)."""
        return self._pending_total + self._in_flight

    def refusal(
        self, config: MemoryConfig, key: ConversationKey, chars: int, *, depth: int, correction: bool
    ) -> str | None:
        """Why a conversation of ``chars`` characters for ``key`` cannot be queued now, or None."""
        replacing = key in self._pending
        limit = config.max_queue_depth + (correction_reserve(config.max_queue_depth) if correction else 0)
        if not replacing and depth >= limit:
            kind = "corrections included" if correction else "max_queue_depth"
            return f"{depth} conversations ({kind})"
        growth = chars - self._pending.get(key, 0)
        if growth > 0 and self.held + growth > config.max_queue_chars:
            return f"{self.held} characters held, max_queue_chars is {config.max_queue_chars}"
        return None

    def put(self, key: ConversationKey, chars: int) -> None:
        self._pending_total += chars - self._pending.get(key, 0)
        self._pending[key] = chars

    def take(self, keys: Iterable[ConversationKey]) -> None:
        """These keys leave the queue for the batch in flight."""
        for key in keys:
            chars = self._pending.pop(key, 0)
            self._pending_total -= chars
            self._in_flight += chars

    def batch_done(self) -> None:
        self._in_flight = 0

    def clear(self) -> None:
        self._pending.clear()
        self._pending_total = 0
