"""Stage 3, update: extract a memory update from a conversation (LLM or rules), apply it, save it."""

from memstore.update.updater import MemoryUpdater, update_memory_from_conversation

__all__ = ["MemoryUpdater", "update_memory_from_conversation"]
