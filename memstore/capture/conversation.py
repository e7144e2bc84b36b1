"""``ConversationContext``: one captured conversation, the single shape every later stage takes.

The middleware or the flush hook builds it once, on the request (the only place that knows the
user), and the queue, the updater and the extractor all receive it whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from memstore.capture.filtering import filter_messages_for_memory
from memstore.capture.message_access import message_type
from memstore.capture.signals import detect_correction, detect_reinforcement
from memstore.document import unstorable
from memstore.errors import InvalidScopeError
from memstore.scope import DEFAULT_TENANT_ID, validate_tenant_id

ConversationKey = tuple[str, str, str, str | None, str | None]
"""``(tenant_id, kind, thread_id, user_id, agent_name)``: the same thread in two tenants is two
conversations, and a session job never coalesces with a conversation that has the session's id."""
CONVERSATION = "conversation"
SESSION_COMPRESS = "session_compress"
"""A session due for compression: ``thread_id`` holds the session id, ``messages`` is empty."""
QUEUE_KINDS = (CONVERSATION, SESSION_COMPRESS)
MAX_THREAD_ID_CHARS = 255
"""As long as a fact's ``source`` column; a longer thread id is refused, never cut (ids would merge)."""


@dataclass
class ConversationContext:
    """One pending conversation; its identity (``tenant_id``, ``user_id``) is captured by the
    producer, never on the worker, which saves it under that identity."""

    thread_id: str
    """The conversation's thread; ``""`` when the caller has none (facts then get source ``unknown``)."""
    messages: list[Any]
    agent_name: str | None = None
    user_id: str | None = None
    correction_detected: bool = False
    reinforcement_detected: bool = False
    timestamp: datetime = field(default_factory=lambda: datetime.now(UTC))
    """When the conversation was captured: a store refuses it for a scope erased after this."""
    attempts: int = 0
    """Queue bookkeeping: processing attempts that ended in a storage outage."""
    not_before: float = 0.0
    """Queue bookkeeping: ``time.monotonic()`` before which a retry is not processed again."""
    tenant_id: str = DEFAULT_TENANT_ID
    """The tenant whose memory the conversation updates; a single-tenant caller never names one."""
    kind: str = CONVERSATION
    """What the queue does with it: learn from a conversation, or compress a session."""

    def __post_init__(self) -> None:
        self.tenant_id = validate_tenant_id(self.tenant_id)
        if self.kind not in QUEUE_KINDS:
            raise InvalidScopeError(f"unknown queue kind {self.kind!r}")
        # The thread id becomes every new fact's source and a queue key: it gets a cap too.
        if len(self.thread_id) > MAX_THREAD_ID_CHARS:
            raise InvalidScopeError(
                f"thread_id is {len(self.thread_id)} characters, over the {MAX_THREAD_ID_CHARS} accepted"
            )
        # An id is never rewritten (two threads would merge): one no store can keep is refused.
        problem = unstorable(self.thread_id)
        if problem is not None:
            raise InvalidScopeError(f"thread_id {problem}")

    @property
    def key(self) -> ConversationKey:
        """The queue's coalescing key: one pending conversation per tenant, thread, user and agent."""
        return (self.tenant_id, self.kind, self.thread_id, self.user_id, self.agent_name)


def capture_conversation(
    messages: Iterable[Any],
    *,
    thread_id: str,
    user_id: str | None,
    agent_name: str | None,
    tenant_id: str = DEFAULT_TENANT_ID,
) -> ConversationContext | None:
    """The memory-relevant part of ``messages``; ``None`` unless a user message and an answer remain."""
    filtered = filter_messages_for_memory(messages)
    types = {message_type(message) for message in filtered}
    if not {"human", "ai"} <= types:
        return None
    correction = detect_correction(filtered)
    # A correction outranks praise in the same window: the updater should fix, not reinforce.
    reinforcement = not correction and detect_reinforcement(filtered)
    return ConversationContext(
        thread_id,
        filtered,
        agent_name=agent_name,
        user_id=user_id,
        correction_detected=correction,
        reinforcement_detected=reinforcement,
        tenant_id=tenant_id,
    )
