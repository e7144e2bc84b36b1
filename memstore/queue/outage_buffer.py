"""Turns the request path could not write to the database, held until it can.

Bounded like the memory queue (``bounds.QueueBudget``: ``max_queue_depth``, its correction
reserve, ``max_queue_chars``) and coalesced the same way, by conversation key with sticky
flags. It lives in the process: a crash during an outage loses what it holds, and nothing else.
"""

from __future__ import annotations

import dataclasses
import threading

from memstore.config import MemoryConfig
from memstore.queue.bounds import QueueBudget, conversation_chars
from memstore.storage.sql.queue.table import QueuedConversation

BufferKey = tuple[str, str, str, str | None, str | None]
"""The conversation key, as the table's: ``(tenant_id, kind, thread_id, user_id, agent_name)``."""
Buffered = tuple[QueuedConversation, bool]
"""A conversation and whether it was queued to run at once."""


def _key(item: QueuedConversation) -> BufferKey:
    return (item.tenant_id, item.kind, item.thread_id, item.user_id, item.agent_name)


class OutageBuffer:
    def __init__(self) -> None:
        self._items: dict[BufferKey, Buffered] = {}
        self._budget = QueueBudget()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def empty(self) -> bool:
        return len(self) == 0

    def put(self, item: QueuedConversation, immediately: bool, config: MemoryConfig) -> str | None:
        """Hold ``item``; returns why it cannot be held (the buffer is full), or None."""
        key = _key(item)
        chars = conversation_chars(item.messages)
        with self._lock:
            refusal = self._budget.refusal(
                config, key, chars, depth=len(self._items), correction=item.correction_detected
            )
            if refusal is not None:
                return refusal
            previous = self._items.get(key)
            if previous is not None:
                older, was_immediate = previous
                item = dataclasses.replace(
                    item,
                    correction_detected=item.correction_detected or older.correction_detected,
                    reinforcement_detected=item.reinforcement_detected or older.reinforcement_detected,
                )
                immediately = immediately or was_immediate
            self._items[key] = (item, immediately)
            self._budget.put(key, chars)
            return None

    def forget(self, item: QueuedConversation) -> None:
        """Drop ``item`` if it is still the buffered turn for its key (it reached the database)."""
        key = _key(item)
        with self._lock:
            entry = self._items.get(key)
            if entry is not None and entry[0] is item:
                del self._items[key]
                self._budget.take([key])
                self._budget.batch_done()

    def snapshot(self) -> list[Buffered]:
        with self._lock:
            return list(self._items.values())

    def remove(self, written: list[Buffered]) -> None:
        """Forget what was written; a newer turn that replaced one of them meanwhile stays."""
        with self._lock:
            for entry in written:
                key = _key(entry[0])
                if self._items.get(key) is entry:
                    del self._items[key]
                    self._budget.take([key])
            self._budget.batch_done()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._budget.clear()
