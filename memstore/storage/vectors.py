"""The vector surface a provider may offer for semantic ranking and search.

Like ``operations.StorageOperations`` it is separate from ``MemoryStorage``: a custom provider
stays valid without it, and the pipeline asks ``vector_store_of`` before using embeddings.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from memstore.config import MemoryConfig
from memstore.embedding import Embedder, get_embedder
from memstore.errors import ConfigError
from memstore.scope import DEFAULT_TENANT_ID, Identity, Scope
from memstore.storage.base import MemoryStorage
from memstore.storage.records import FactFilter, FactPage

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnembeddedFact:
    """A live fact to embed: it has no valid vector under the configured model (or a rebuild asked)."""

    row_id: int
    user_id: str | None
    agent_name: str | None
    fact_id: str
    content: str
    tenant_id: str = DEFAULT_TENANT_ID


@dataclass(frozen=True)
class EmbeddingStatus:
    """Valid vectors per (model, dimension), how many live facts exist, and what serves search."""

    live_facts: int
    vectors: dict[tuple[str, int], int]
    backend: str

    def embedded(self, model: str) -> int:
        return sum(count for (name, _), count in self.vectors.items() if name == model)

    def missing(self, model: str) -> int:
        """Live facts with no valid vector under ``model``."""
        return self.live_facts - self.embedded(model)

    def other_models(self, model: str) -> dict[str, int]:
        """Valid vectors made by another model: the sign of a model change."""
        counts: dict[str, int] = {}
        for (name, _), count in self.vectors.items():
            if name != model:
                counts[name] = counts.get(name, 0) + count
        return counts


@runtime_checkable
class VectorStore(Protocol):
    def for_identity(self, identity: Identity) -> VectorStore:
        """The same store acting inside ``identity``'s tenant, with its roles."""

    def fact_vectors(
        self, scope: Scope, model: str, facts: Sequence[tuple[str, str]]
    ) -> dict[str, np.ndarray]:
        """Valid vectors of the scope's live ``(fact id, content)`` facts, by fact id; others absent."""

    def store_vectors(self, scope: Scope, model: str, items: Sequence[tuple[str, str, np.ndarray]]) -> int:
        """Write ``(fact id, embedded content, vector)``; a fact gone or edited since gets none."""

    def unembedded_facts(
        self, model: str, *, limit: int, after: int = 0, scope: Scope | None = None, rebuild: bool = False
    ) -> list[UnembeddedFact]:
        """Live facts to embed, in row order from ``after``; every live fact with ``rebuild``."""

    def nearest_facts(
        self, where: FactFilter, vector: np.ndarray, *, model: str, limit: int, offset: int
    ) -> FactPage:
        """Live facts matching ``where``, most similar to ``vector`` first (similarity as ``rank``)."""

    def status(self) -> EmbeddingStatus: ...


def vector_store_of(storage: MemoryStorage) -> VectorStore | None:
    """The provider's vector store, or ``None`` when it keeps no vectors (the file provider)."""
    store = getattr(storage, "vectors", None)
    return store if isinstance(store, VectorStore) else None


def semantic_parts(config: MemoryConfig, storage: MemoryStorage) -> tuple[Embedder, VectorStore] | None:
    """The embedder and vector store to rank with; ``None`` with ``embedding_provider: none``.

    A provider that keeps no vectors with embeddings configured is a ``ConfigError``, not a
    silent return to full-text ranking.
    """
    embedder = get_embedder(config)
    if embedder is None:
        return None
    store = vector_store_of(storage)
    if store is None:
        raise ConfigError(
            f"embedding_provider {config.embedding_provider!r} needs a storage provider that keeps "
            f"vectors (the SQL provider); {type(storage).__name__} keeps none"
        )
    _warn_once_on_model_change(store, embedder.model)
    return embedder, store


_checked: set[tuple[int, str]] = set()
_checked_lock = threading.Lock()


def _warn_once_on_model_change(store: VectorStore, model: str) -> None:
    """Say once per process and model when stored vectors were made by another model.

    Those facts rank as if they had no vector (they are never compared with this model's
    vectors) until ``memstore embed --rebuild``; the queue worker re-embeds a scope's facts only
    as its conversations arrive.
    """
    key = (id(store), model)
    with _checked_lock:
        if key in _checked:
            return
        _checked.add(key)
    try:
        others = store.status().other_models(model)
    except Exception:
        with _checked_lock:
            _checked.discard(key)
        raise
    if others:
        found = ", ".join(f"{count} by {name}" for name, count in sorted(others.items()))
        logger.warning(
            "the embedding model changed: stored vectors (%s) were not made by %s and are ignored "
            "until `memstore embed --rebuild`",
            found,
            model,
        )
