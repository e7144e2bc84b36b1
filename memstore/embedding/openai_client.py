"""``openai``: any OpenAI-compatible ``/v1/embeddings`` endpoint, through the official client.

Its base URL, key and model may differ from the chat endpoint's (each defaults to the LLM's).
Texts go in batches of ``embedding_batch_size``, one request after another; bulk embedding
(``memstore.ops.embeddings``) keeps ``concurrency`` requests in flight instead, because a remote
endpoint's round trip, not its speed, bounds a single stream of requests (docs/performance.md,
"Embedding throughput"). The client's own retries are off, as for the LLM,
so ``embedding_timeout_seconds`` is the client's timeout for a call (connect and each read; a
query's call, on the request path, at most half of ``memory_context_timeout_seconds``, and
``gateway.ranking`` also cuts it off there). The reply is checked before any vector is used:
one finite vector per text, all of one length (``embedding_dimensions`` when set, else the same
across a call's batches); anything else, a non-JSON or HTML body included, is an ``EmbeddingError``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from openai import APIConnectionError, APIStatusError, AsyncOpenAI, OpenAI, OpenAIError, omit

from memstore.async_face import await_on_loop, loop_resource, running_loop
from memstore.config import MemoryConfig
from memstore.embedding.base import embeddable
from memstore.embedding.vectors import normalized
from memstore.errors import ConfigError, EmbeddingError, EmbeddingUnavailableError

PLACEHOLDER_API_KEY = "not-needed"
PARALLEL_REQUESTS = 4
"""Requests a bulk run keeps in flight. Four covered a 100 ms round trip (2.5x one at a time, and
eight did no better); more would only sharpen a rate-limited account's bursts."""


async def _close_client(client: AsyncOpenAI) -> None:
    await client.close()


def _failure(exc: OpenAIError) -> EmbeddingError:
    """Connection trouble and 408/409/429/5xx may pass later; anything else will not."""
    transient = isinstance(exc, APIConnectionError) or (
        isinstance(exc, APIStatusError) and (exc.status_code in (408, 409, 429) or exc.status_code >= 500)
    )
    kind = EmbeddingUnavailableError if transient else EmbeddingError
    return kind(f"the embeddings endpoint failed: {type(exc).__name__}: {exc}")


class OpenAIEmbedder:
    concurrency = PARALLEL_REQUESTS
    """How many ``embed_documents`` calls of ``batch_size`` texts a bulk run may make at once."""

    def __init__(self, config: MemoryConfig) -> None:
        if not config.embedding_model:
            raise ConfigError("embedding_provider 'openai' needs embedding_model (MEMSTORE_EMBEDDING_MODEL)")
        self._name = config.embedding_model
        # The requested length is part of the identity: shortened vectors are not comparable.
        suffix = f"@{config.embedding_dimensions}" if config.embedding_dimensions else ""
        self.model = f"openai:{config.embedding_model}{suffix}"
        self._dimensions = config.embedding_dimensions
        self.batch_size = config.embedding_batch_size
        # A query is embedded on the request path: leave memory_context half its time for the rest.
        self._query_timeout = min(config.embedding_timeout_seconds, config.memory_context_timeout_seconds / 2)
        secret = config.embedding_api_key or config.llm_api_key
        self._client_options: dict[str, Any] = {
            "base_url": config.embedding_base_url or config.llm_base_url,
            "api_key": secret.get_secret_value() if secret else PLACEHOLDER_API_KEY,
            "timeout": config.embedding_timeout_seconds,
            "max_retries": 0,
        }
        self._client = OpenAI(**self._client_options)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            rows.extend(self._call(list(texts[start : start + self.batch_size])))
        if not rows:
            return np.zeros((0, self._dimensions or 0), dtype=np.float32)
        if len({len(row) for row in rows}) > 1:
            raise EmbeddingError(
                "the embeddings endpoint returned vectors of different lengths across batches"
            )
        return normalized(np.asarray(rows, dtype=np.float32))

    def embed_query(self, text: str) -> np.ndarray:
        rows = self._call([text], timeout=self._query_timeout)
        first: np.ndarray = normalized(np.asarray(rows, dtype=np.float32))[0]
        return first

    def _call(self, batch: list[str], *, timeout: float | None = None) -> list[list[float]]:
        request: dict[str, Any] = {
            "model": self._name,
            "input": [embeddable(text) for text in batch],
            "encoding_format": "float",
            "dimensions": self._dimensions if self._dimensions else omit,
        }
        try:
            if running_loop() is None:
                client = self._client if timeout is None else self._client.with_options(timeout=timeout)
                reply = client.embeddings.create(**request)
            else:
                reply = await_on_loop(self._loop_client(timeout).embeddings.create(**request))
            return self._vectors(reply.data, len(batch))
        except OpenAIError as exc:
            raise _failure(exc) from exc
        except EmbeddingError:
            raise
        except Exception as exc:  # a proxy's HTML page, a non-JSON body, ``"data": null`` ...
            raise EmbeddingError(
                f"the embeddings endpoint sent a malformed reply: {type(exc).__name__}: {exc}"
            ) from exc

    def _loop_client(self, timeout: float | None) -> AsyncOpenAI:
        """The async face's client: one per event loop, its connections being the loop's."""
        client = loop_resource(
            ("embeddings", *sorted(self._client_options.items())),
            lambda: AsyncOpenAI(**self._client_options),
            _close_client,
        )
        return client if timeout is None else client.with_options(timeout=timeout)

    def _vectors(self, data: Sequence[Any], count: int) -> list[list[float]]:
        """One finite vector per text, in input order, all of the expected length."""
        data = sorted(data, key=lambda item: item.index)
        if len(data) != count or [item.index for item in data] != list(range(count)):
            raise EmbeddingError(f"the embeddings endpoint returned {len(data)} vectors for {count} texts")
        vectors = [list(item.embedding) for item in data]
        lengths = {len(vector) for vector in vectors}
        expected = self._dimensions or next(iter(lengths))
        if lengths != {expected} or expected == 0:
            raise EmbeddingError(
                f"the embeddings endpoint returned vectors of length {sorted(lengths)}, not {expected}"
            )
        if not all(
            isinstance(value, float | int) and math.isfinite(value) for vector in vectors for value in vector
        ):
            raise EmbeddingError("the embeddings endpoint returned a non-finite or non-numeric value")
        return vectors
