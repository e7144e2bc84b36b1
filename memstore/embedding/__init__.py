"""Text embeddings for relevance: the ``Embedder`` protocol, its providers, and one per process."""

from memstore.embedding.base import MAX_EMBED_CHARS, Embedder
from memstore.embedding.loader import get_embedder

__all__ = ["MAX_EMBED_CHARS", "Embedder", "get_embedder"]
