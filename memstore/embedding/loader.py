"""``get_embedder``: the configured provider, built once per process and settings."""

from __future__ import annotations

import threading

from memstore.config import MemoryConfig
from memstore.embedding.base import Embedder

_embedders: dict[tuple[object, ...], Embedder] = {}
_lock = threading.Lock()


def _key(config: MemoryConfig) -> tuple[object, ...]:
    key = config.embedding_api_key.get_secret_value() if config.embedding_api_key else None
    llm_key = config.llm_api_key.get_secret_value() if config.llm_api_key else None
    return (
        config.embedding_provider,
        config.embedding_model,
        config.embedding_base_url or config.llm_base_url,
        key or llm_key,
        config.embedding_dimensions,
        config.embedding_batch_size,
        config.embedding_timeout_seconds,
        config.memory_context_timeout_seconds,
    )


def get_embedder(config: MemoryConfig) -> Embedder | None:
    """The embedder ``config`` asks for, or ``None`` for ``embedding_provider: none``.

    One client (or one loaded local model) per distinct setting, shared by every thread.
    """
    if config.embedding_provider == "none":
        return None
    key = _key(config)
    with _lock:
        found = _embedders.get(key)
        if found is None:
            found = _build(config)
            _embedders[key] = found
        return found


def _build(config: MemoryConfig) -> Embedder:
    if config.embedding_provider == "local":
        from memstore.embedding.local import LocalEmbedder

        return LocalEmbedder()
    from memstore.embedding.openai_client import OpenAIEmbedder

    return OpenAIEmbedder(config)
