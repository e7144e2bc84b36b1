"""The bounded, in-process buffer of saves that failed on an outage, replayed when the database returns.

DeerFlow's updater turns a failed ``save`` into ``False`` and its queue never retries, so without
this buffer an outage between the updater's load and its save loses the conversation's update.
Each kept save still carries the revision its document was loaded at, so its replay merges with
whatever landed meanwhile (memstore's usual rules: no lost facts, no resurrected deletions) and a
scope cleared or erased since is not written back.

Bounds: at most ``limit`` saves are kept; beyond that the oldest is dropped with an error log
naming its scope. The buffer lives in the process: a restart during the outage loses it (the log
says how many were pending).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from memstore.document import MemoryDocument
from memstore.errors import StorageUnavailableError

logger = logging.getLogger(__name__)

DEFAULT_REPLAY_LIMIT = 1_000
RETRY_INTERVAL_SECONDS = 2.0
"""How long a failed replay waits before the next call tries again, so an outage costs one probe."""


@dataclass(frozen=True)
class PendingSave:
    """One save that met an outage: the document as memstore's provider takes it, and its scope."""

    document: MemoryDocument
    agent_name: str | None
    user_id: str | None
    captured_at: datetime
    restore_stored: bool = False
    """A document without a load token, whose facts get back the memory-record keys stored for
    the same id and content when it is written (``record_view.py``)."""


class ReplayBuffer:
    """Saves kept through an outage, oldest first."""

    def __init__(self, limit: int = DEFAULT_REPLAY_LIMIT) -> None:
        self._limit = limit
        self._pending: deque[PendingSave] = deque()
        self._lock = threading.Lock()
        self._replaying = threading.Lock()
        self._next_attempt = 0.0

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def keep(self, pending: PendingSave) -> None:
        with self._lock:
            if len(self._pending) >= self._limit:
                dropped = self._pending.popleft()
                logger.error(
                    "memstore replay buffer full (%d saves): dropped the oldest, for user %s agent %s",
                    self._limit,
                    dropped.user_id,
                    dropped.agent_name,
                )
            self._pending.append(pending)
            self._next_attempt = time.monotonic() + RETRY_INTERVAL_SECONDS

    def replay(self, save: Callable[[PendingSave], bool], *, force: bool = False) -> int:
        """Replay kept saves in order until one meets the outage again; returns how many are left.

        ``save`` raises ``StorageUnavailableError`` while the database is away; any other outcome
        (saved, refused as stale, malformed) settles the entry. One thread replays at a time.
        """
        with self._lock:
            if not self._pending or (not force and time.monotonic() < self._next_attempt):
                return len(self._pending)
        if not self._replaying.acquire(blocking=False):
            return len(self)
        try:
            while True:
                with self._lock:
                    if not self._pending:
                        return 0
                    head = self._pending[0]
                try:
                    saved = save(head)
                except StorageUnavailableError:
                    with self._lock:
                        self._next_attempt = time.monotonic() + RETRY_INTERVAL_SECONDS
                        return len(self._pending)
                with self._lock:
                    if self._pending and self._pending[0] is head:
                        self._pending.popleft()
                if saved:
                    logger.info("memstore replayed a save kept through an outage (user %s)", head.user_id)
                else:
                    logger.error("memstore could not replay a kept save for user %s; see above", head.user_id)
        finally:
            self._replaying.release()
