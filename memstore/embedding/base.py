"""What every embedding provider offers: normalised float32 vectors, and the model that made them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np


MAX_EMBED_CHARS = 8000
"""Longer texts are cut to this many characters before embedding (a fact is capped well below it;
a query is a pasted document at worst, and its start says what it is about)."""


def embeddable(text: str) -> str:
    """``text`` cut to ``MAX_EMBED_CHARS``, with lone surrogates (which no UTF-8 encoder takes) replaced."""
    return text[:MAX_EMBED_CHARS].encode("utf-8", "replace").decode("utf-8")


class Embedder(Protocol):
    model: str
    """``provider:model``, stored with every vector: a different value is a model change."""

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of stored texts (facts), shape ``(len(texts), dimension)``, rows L2-normalised."""

    def embed_query(self, text: str) -> np.ndarray:
        """The vector of a query (a user message, a search), shape ``(dimension,)``, L2-normalised."""
