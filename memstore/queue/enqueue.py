"""The request path's side of the database queue: what a row holds, and a wait with a bound.

``queue_enqueue_timeout_seconds`` bounds each write twice over. The server enforces it (the
request path's own PostgreSQL engine sets ``statement_timeout``, ``lock_timeout`` and
``connect_timeout``; SQLite's busy timeout), and the caller stops waiting after it
(``BoundedCalls``), because a server that hangs instead of refusing enforces nothing.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from memstore.capture.conversation import ConversationContext
from memstore.capture.filtering import bound_conversation
from memstore.capture.message_access import text_only
from memstore.document import as_utc
from memstore.queue.debounced import MAX_QUEUED_CONVERSATION_CHARS, MAX_QUEUED_MESSAGE_CHARS
from memstore.storage.sql.engine import get_engine
from memstore.storage.sql.queue_table import QueuedConversation

T = TypeVar("T")
ENQUEUE_THREADS = 8
"""Threads that run request-path writes; while every one is stuck, turns go to the buffer."""


def enqueue_engine(url: str, timeout: float) -> Engine:
    """An engine whose server-side waits are bounded by ``timeout``: the request path's own pool."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return get_engine(url)
    ms = round(timeout * 1000)
    # libpq counts connect_timeout in whole seconds (and treats 1 as 2).
    query = {
        "connect_timeout": str(max(2, math.ceil(timeout))),
        "options": f"-c statement_timeout={ms} -c lock_timeout={ms}",
    }
    return get_engine(parsed.update_query_dict(query))


def queued_conversation(context: ConversationContext) -> QueuedConversation:
    """The conversation as a queue row keeps it: text only, trimmed to the queue's caps."""
    bounded = bound_conversation(
        context.messages,
        max_message_chars=MAX_QUEUED_MESSAGE_CHARS,
        max_total_chars=MAX_QUEUED_CONVERSATION_CHARS,
    )
    return QueuedConversation(
        thread_id=context.thread_id,
        user_id=context.user_id,
        agent_name=context.agent_name,
        messages=[text_only(message) for message in bounded],
        correction_detected=context.correction_detected,
        reinforcement_detected=context.reinforcement_detected,
        captured_at=as_utc(context.timestamp),
    )


class BoundedCalls:
    """Runs calls on daemon threads and hands back a ``Future`` the caller waits on with a timeout.

    Daemon threads, unlike ``ThreadPoolExecutor``'s, do not hold up interpreter exit while a
    write hangs on a stopped server. Busy threads are normal under load (more are started, up to
    ``ENQUEUE_THREADS``, and jobs wait their turn); only when every thread has been inside one
    call for longer than ``stuck_after`` does ``run`` refuse, so the caller can move on at once.
    """

    def __init__(self, name: str, *, stuck_after: Callable[[], float]) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._name = name
        self._stuck_after = stuck_after
        self._started: dict[int, float | None] = {}
        """Per thread: when its current call started, or None while it waits for one."""
        self._lock = threading.Lock()

    def run(self, function: Callable[..., T], *args: Any) -> Future[T] | None:
        """The call's future, or ``None`` when every thread is stuck in a call: the caller moves on."""
        future: Future[T] = Future()
        with self._lock:
            idle = sum(1 for started in self._started.values() if started is None)
            if idle <= self._jobs.qsize():
                if len(self._started) < ENQUEUE_THREADS:
                    self._start_thread()
                elif self._all_stuck():
                    return None
            self._jobs.put((future, function, args))
        return future

    def _all_stuck(self) -> bool:
        cutoff = time.monotonic() - self._stuck_after()
        return all(started is not None and started < cutoff for started in self._started.values())

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._serve, name=f"{self._name}-{len(self._started)}", daemon=True)
        thread.start()
        self._started[thread.ident or id(thread)] = None

    def _serve(self) -> None:
        me = threading.get_ident()
        while True:
            future, function, args = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._started[me] = time.monotonic()
            try:
                future.set_result(function(*args))
            except BaseException as exc:
                future.set_exception(exc)
            finally:
                with self._lock:
                    self._started[me] = None
