"""What the queue needs from an updater, and the counters it reports."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from memstore.async_face import run_on_loop
from memstore.capture.conversation import ConversationContext
from memstore.scope import DEFAULT_TENANT_ID


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
    """New keys dropped because ``max_queue_depth`` or ``max_queue_chars`` was reached."""
    rejected_user_share: int = 0
    """Database queue: new keys dropped because their user holds ``queue_user_share`` of a bound."""
    rejected_tenant_share: int = 0
    """Database queue: new keys dropped because their tenant holds ``queue_tenant_share`` of a bound."""
    rejected_invalid: int = 0
    """Database queue: turns the database refused for their own content; dropped, never retried."""
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
    dead: int = 0
    """Database queue: conversations moved to ``dead`` after ``update_max_attempts`` failures."""
    taken_over: int = 0
    """Database queue: updates not saved because their lease expired and another worker took over."""


class UpdateQueue(ABC):
    """The API both queues offer (``MemoryUpdateQueue`` and ``DatabaseUpdateQueue``).

    ``add`` and ``add_nowait`` are the reference's calls, written once here in terms of ``submit``.
    """

    def add(
        self,
        thread_id: str,
        messages: list[Any],
        agent_name: str | None = None,
        user_id: str | None = None,
        correction_detected: bool = False,
        reinforcement_detected: bool = False,
        *,
        tenant_id: str = DEFAULT_TENANT_ID,
    ) -> None:
        """Queue a conversation, due after the debounce."""
        self.submit(
            ConversationContext(
                thread_id,
                list(messages),
                agent_name,
                user_id,
                correction_detected,
                reinforcement_detected,
                tenant_id=tenant_id,
            )
        )

    def add_nowait(
        self,
        thread_id: str,
        messages: list[Any],
        agent_name: str | None = None,
        user_id: str | None = None,
        correction_detected: bool = False,
        reinforcement_detected: bool = False,
        *,
        tenant_id: str = DEFAULT_TENANT_ID,
    ) -> None:
        """Queue a conversation, due now."""
        self.submit(
            ConversationContext(
                thread_id,
                list(messages),
                agent_name,
                user_id,
                correction_detected,
                reinforcement_detected,
                tenant_id=tenant_id,
            ),
            immediately=True,
        )

    @abstractmethod
    def submit(self, context: ConversationContext, *, immediately: bool = False) -> None: ...

    async def asubmit(self, context: ConversationContext, *, immediately: bool = False) -> None:
        """``submit`` on the async face (``memstore.async_face``): a queue that writes to the
        database does so on the event loop, within the same bound."""
        await run_on_loop(self.submit, context, immediately=immediately)

    @abstractmethod
    def flush(self) -> None: ...

    @abstractmethod
    def clear(self) -> None:
        """Drop what this process queued and no worker has started; running updates finish."""

    @abstractmethod
    def flush_nowait(self) -> None: ...

    @abstractmethod
    def shutdown(self, timeout: float | None = None) -> bool: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def wait_idle(self, timeout: float | None = None) -> bool: ...

    @property
    @abstractmethod
    def is_processing(self) -> bool: ...

    @property
    @abstractmethod
    def pending_count(self) -> int: ...

    @property
    @abstractmethod
    def stats(self) -> QueueStats: ...
