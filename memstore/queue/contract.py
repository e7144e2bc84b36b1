"""What the queue needs from an updater, and the counters it reports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from memstore.capture.conversation import ConversationContext


class ConversationUpdater(Protocol):
    """What the queue needs from an updater: one call per conversation.

    Raising ``StorageUnavailableError`` asks for a retry later; any other exception is logged
    and the conversation is dropped.
    """

    def update(self, context: ConversationContext) -> bool:
        """Update the context's scope from its conversation; ``True`` once the result is saved."""
        ...


UpdaterFactory = Callable[[], ConversationUpdater]


@dataclass(frozen=True)
class QueueStats:
    """Counters since the queue was created, for logs, metrics and the reliability suite."""

    accepted: int = 0
    """Conversations admitted (including ones that replaced a pending turn of the same key)."""
    rejected_full: int = 0
    """New keys dropped because ``max_queue_depth`` was reached."""
    updated: int = 0
    """Updates the updater saved."""
    skipped: int = 0
    """Updater calls that saved nothing (no new memory, a bad reply, a refused save)."""
    errors: int = 0
    """Updater calls that raised something other than an outage; those conversations are gone."""
    retries: int = 0
    """Conversations put back after an outage."""
    abandoned: int = 0
    """Conversations dropped because the outage outlasted ``update_max_attempts`` or shutdown."""
