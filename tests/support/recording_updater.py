"""A stand-in for the LLM updater that records what the queue hands it.

The queue's updater is injected through its own ``updater_factory`` argument; recording the
calls lets tests observe scheduling, scoping and flags without an LLM.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from memstore.capture.conversation import ConversationContext
from memstore.capture.message_access import message_text
from memstore.gateway.user_context import get_effective_user_id


@dataclass(frozen=True)
class UpdateCall:
    messages: list[Any]
    thread_id: str | None
    agent_name: str | None
    correction_detected: bool
    reinforcement_detected: bool
    user_id: str | None
    worker_thread: threading.Thread
    ambient_user_id: str
    at: float

    @property
    def texts(self) -> list[str]:
        return [message_text(message) for message in self.messages]


@dataclass
class RecordingUpdater:
    """Records each call; optionally blocks on ``gate`` or raises for chosen thread ids."""

    gate: threading.Event | None = None
    fail_threads: frozenset[str] = frozenset()
    calls: list[UpdateCall] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    factory_calls: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _changed: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._changed = threading.Condition(self._lock)

    def factory(self) -> RecordingUpdater:
        with self._lock:
            self.factory_calls += 1
        return self

    def update(self, context: ConversationContext) -> bool:
        self.started.set()
        if self.gate is not None:
            self.gate.wait(10)
        thread_id = context.thread_id
        call = UpdateCall(
            list(context.messages),
            thread_id,
            context.agent_name,
            context.correction_detected,
            context.reinforcement_detected,
            context.user_id,
            threading.current_thread(),
            get_effective_user_id(),
            time.monotonic(),
        )
        with self._changed:
            self.calls.append(call)
            self._changed.notify_all()
        if thread_id in self.fail_threads:
            raise RuntimeError(f"updater failed for {thread_id}")
        return True

    def wait_for_calls(self, count: int, timeout: float = 5.0) -> list[UpdateCall]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.calls) >= count, timeout):
                raise AssertionError(f"expected {count} updater calls, got {len(self.calls)}")
            return list(self.calls)
