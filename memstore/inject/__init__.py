"""Stage 4, inject: render stored memory as a ``<memory>`` block within a token budget."""

from memstore.inject.render import format_memory_for_injection, wrap_memory_block

__all__ = ["format_memory_for_injection", "wrap_memory_block"]
