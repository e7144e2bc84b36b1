"""The process-wide queue: created on first use, drained at interpreter exit."""

from __future__ import annotations

import atexit
import logging
import threading

from memstore.config import MemoryConfig, get_memory_config
from memstore.queue.debounced import MemoryUpdateQueue

logger = logging.getLogger(__name__)

_queue: MemoryUpdateQueue | None = None
_queue_lock = threading.Lock()
_atexit_registered = False


def get_memory_queue() -> MemoryUpdateQueue:
    """The process-wide queue, created on first use; it is drained at interpreter exit."""
    global _queue, _atexit_registered
    with _queue_lock:
        if _queue is None:
            _queue = MemoryUpdateQueue()
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
        return _queue


def set_memory_queue(queue: MemoryUpdateQueue) -> None:
    """Install ``queue`` as the process-wide one, e.g. built with a custom updater factory."""
    global _queue
    with _queue_lock:
        _queue = queue


def reset_memory_queue() -> None:
    """Discard the process-wide queue and its pending work (tests, config changes)."""
    global _queue
    with _queue_lock:
        queue, _queue = _queue, None
    if queue is not None:
        queue.clear()


def _shutdown_at_exit() -> None:
    with _queue_lock:
        queue = _queue
    if queue is None:
        return
    try:
        timeout = get_memory_config().shutdown_timeout_seconds
    except Exception:
        logger.exception("memory config unavailable at exit; using the default shutdown timeout")
        timeout = MemoryConfig().shutdown_timeout_seconds
    queue.shutdown(timeout)
