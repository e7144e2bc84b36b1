"""Stage 2, queue: debounce captured conversations and hand them to the updater off the request path."""

from memstore.queue.contract import ConversationUpdater, QueueStats, UpdateQueue, UpdaterFactory
from memstore.queue.database import DatabaseUpdateQueue
from memstore.queue.debounced import MemoryUpdateQueue
from memstore.queue.process import (
    build_memory_queue,
    get_memory_queue,
    queue_failure,
    reset_memory_queue,
    set_memory_queue,
)
from memstore.queue.retry import retry_delay

__all__ = [
    "ConversationUpdater",
    "DatabaseUpdateQueue",
    "MemoryUpdateQueue",
    "QueueStats",
    "UpdateQueue",
    "UpdaterFactory",
    "build_memory_queue",
    "get_memory_queue",
    "queue_failure",
    "reset_memory_queue",
    "retry_delay",
    "set_memory_queue",
]
