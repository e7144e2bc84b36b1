"""The process-wide queue: created on first use, shut down at interpreter exit.

``queue_backend`` picks it: ``database`` (the default with the SQL provider) keeps queued
conversations in the memory database, shared by every process; ``memory`` keeps them in this
process (the default with any other provider, and a choice for tests).
"""

from __future__ import annotations

import atexit
import logging
import threading

from memstore.config import MemoryConfig, get_memory_config
from memstore.errors import ConfigError
from memstore.queue.contract import UpdateQueue
from memstore.queue.database import DatabaseUpdateQueue
from memstore.queue.debounced import MemoryUpdateQueue
from memstore.storage.loader import load_storage_class
from memstore.storage.sql.engine import database_url_from_config
from memstore.storage.sql.provider import SqlMemoryStorage

logger = logging.getLogger(__name__)

QueueTarget = tuple[str, str | None]
_queue: UpdateQueue | None = None
_built_for: tuple[MemoryConfig, QueueTarget] | None = None
"""The config the process-wide queue was built for, and its target; None when it was installed."""
_queue_lock = threading.Lock()
_atexit_registered = False


def queue_backend(config: MemoryConfig) -> str:
    """The backend ``config`` selects; ``database`` with a provider other than SQL is refused."""
    sql = issubclass(load_storage_class(config.storage_class), SqlMemoryStorage)
    backend = config.queue_backend or ("database" if sql else "memory")
    if backend == "database" and not sql:
        raise ConfigError(
            f"queue_backend 'database' needs the SQL provider, but storage_class is {config.storage_class}; "
            "set queue_backend: memory"
        )
    return backend


def build_memory_queue(config: MemoryConfig | None = None) -> UpdateQueue:
    """A new queue for ``config`` (default: the process's)."""
    config = config or get_memory_config()
    if queue_backend(config) == "database":
        return DatabaseUpdateQueue(database_url_from_config(config))
    return MemoryUpdateQueue()


def queue_target(config: MemoryConfig) -> QueueTarget:
    """Where a queue built for ``config`` keeps its turns: the backend, and the database's URL."""
    backend = queue_backend(config)
    return (backend, database_url_from_config(config) if backend == "database" else None)


def get_memory_queue() -> UpdateQueue:
    """The process-wide queue, created on first use; it is shut down at interpreter exit.

    A queue this function built follows the configuration: after ``set_memory_config`` names
    another database (or backend), the next call closes it (its rows stay queued where they
    are) and builds one for the new target, so a turn always lands where the configuration at
    its capture said. A queue installed with ``set_memory_queue`` is the installer's to replace.
    """
    global _queue, _built_for, _atexit_registered
    config = get_memory_config()
    retired: UpdateQueue | None = None
    with _queue_lock:
        if _queue is not None and _built_for is not None and _built_for[0] is not config:
            target = queue_target(config)
            if target == _built_for[1]:
                _built_for = (config, target)
            else:
                logger.info("memory queue: the configured %s changed; building a new queue", target[0])
                retired, _queue = _queue, None
        if _queue is None:
            _queue = build_memory_queue(config)
            _built_for = (config, queue_target(config))
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
        queue = _queue
    if retired is not None:
        retired.close()
    return queue


def set_memory_queue(queue: UpdateQueue) -> None:
    """Install ``queue`` as the process-wide one, e.g. built with a custom updater factory."""
    global _queue, _built_for
    with _queue_lock:
        _queue, _built_for = queue, None


def reset_memory_queue() -> None:
    """Discard the process-wide queue (tests, config changes): a memory queue's pending work is
    dropped, a database queue's workers stop and its rows stay queued."""
    global _queue, _built_for
    with _queue_lock:
        queue, _queue, _built_for = _queue, None, None
    if queue is not None:
        queue.close()


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
