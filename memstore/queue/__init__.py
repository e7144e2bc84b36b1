"""Stage 2, queue: debounce captured conversations and hand them to the updater off the request path."""

from memstore.queue.contract import ConversationUpdater, QueueStats, UpdaterFactory
from memstore.queue.debounced import MemoryUpdateQueue, retry_delay
from memstore.queue.process import get_memory_queue, reset_memory_queue, set_memory_queue

__all__ = [
    "ConversationUpdater",
    "MemoryUpdateQueue",
    "QueueStats",
    "UpdaterFactory",
    "get_memory_queue",
    "reset_memory_queue",
    "retry_delay",
    "set_memory_queue",
]
