"""The process-wide queue: created on first use, shut down at interpreter exit.

``queue_backend`` picks it: ``database`` (the default with the SQL provider) keeps queued
conversations in the memory database, shared by every process; ``memory`` keeps them in this
process (the default with any other provider, and a choice for tests).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading

from memstore.config import MemoryConfig, get_memory_config
from memstore.errors import ConfigError, InvalidScopeError
from memstore.queue.contract import UpdateQueue
from memstore.queue.database import DatabaseUpdateQueue
from memstore.queue.debounced import MemoryUpdateQueue
from memstore.storage.loader import load_storage_class
from memstore.storage.sql.documents.provider import SqlMemoryStorage
from memstore.storage.sql.engine import database_url_from_config
from memstore.update.updater import describe_failure

logger = logging.getLogger(__name__)

QueueTarget = tuple[str, str | None]
_queue: UpdateQueue | None = None
_built_for: tuple[MemoryConfig, QueueTarget] | None = None
_owners: dict[tuple[int, QueueTarget], str] = {}
"""The owner id of the process-wide queue built for each database: a queue built for it again
takes over the rows the earlier one queued (its ``flush``, ``pending_count`` and ``clear``)."""
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


def build_memory_queue(config: MemoryConfig | None = None, *, owner: str | None = None) -> UpdateQueue:
    """A new queue for ``config`` (default: the process's); a database queue may take over
    ``owner``'s rows (``flush``, ``pending_count`` and ``clear`` act on the owner's rows)."""
    config = config or get_memory_config()
    if queue_backend(config) == "database":
        return DatabaseUpdateQueue(
            database_url_from_config(config), owner=owner, operator_url=config.operator_database_url
        )
    return MemoryUpdateQueue()


def queue_failure(exc: BaseException) -> str:
    """Why a turn could not be queued, as a log line may say it: an invalid id's message quotes the
    id, so it is reduced to what was wrong; other errors as ``describe_failure`` shows them."""
    if isinstance(exc, InvalidScopeError):
        return (
            "InvalidScopeError: the user id, agent name or thread id is not valid "
            "(external ids go through make_safe_user_id)"
        )
    return describe_failure(exc)


def queue_target(config: MemoryConfig) -> QueueTarget:
    """Where a queue built for ``config`` keeps its turns (the backend and the database's URL) or,
    for the memory queue, where its updates are saved (the storage class and its location)."""
    backend = queue_backend(config)
    if backend == "database":
        return (backend, database_url_from_config(config))
    return (backend, f"{config.storage_class} {config.data_dir} {config.database_url or ''}")


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
            if target == _built_for[1] or (target[0] == _built_for[1][0] == "memory"):
                if target != _built_for[1]:
                    _warn_memory_queue_moves(_queue)
                _built_for = (config, target)
            else:
                logger.info("memory queue: the configured %s changed; building a new queue", target[0])
                retired, _queue = _queue, None
        if _queue is None:
            target = queue_target(config)
            mine = (os.getpid(), target)  # a forked child is an owner of its own
            _queue = build_memory_queue(config, owner=_owners.get(mine))
            if isinstance(_queue, DatabaseUpdateQueue):
                _owners[mine] = _queue.owner
            _built_for = (config, target)
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
        queue = _queue
    if isinstance(retired, DatabaseUpdateQueue):
        retired.close()  # its rows stay queued; a queue built for that database again takes them over
    elif retired is not None:
        _warn_memory_queue_moves(retired)
        retired.shutdown(config.shutdown_timeout_seconds)  # drained, not dropped
    return queue


def _warn_memory_queue_moves(queue: UpdateQueue) -> None:
    """The memory queue saves with the configuration current when it runs: say so when turns
    captured under another storage are waiting, rather than move them silently."""
    waiting = queue.pending_count
    if waiting:
        logger.warning(
            "memory queue: the storage changed with %d conversation(s) queued in memory; they are "
            "saved to the new storage (call flush() before set_memory_config to keep them where "
            "they were captured)",
            waiting,
        )


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
