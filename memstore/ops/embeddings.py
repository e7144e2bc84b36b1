"""Embedding every live fact, and what the vector table holds, for ``memstore embed``.

The queue worker embeds a scope's new facts right after each update, so this is for what it did
not see: facts from before embeddings were configured, imports, manual edits on another
provider's schedule, and a model change (``rebuild``), which leaves every stored vector invalid.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memstore.config import MemoryConfig, get_memory_config
from memstore.embedding import Embedder
from memstore.errors import ConfigError
from memstore.scope import Identity, Scope
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.vectors import EmbeddingStatus, VectorStore, semantic_parts, vector_store_of

EMBED_BATCH = 256
"""Facts read and embedded per round (the provider splits it into ``embedding_batch_size`` calls)."""


NO_EMBEDDINGS = "embedding_provider is none: set it to openai or local to embed facts"


@dataclass(frozen=True)
class EmbeddingReport:
    """What is embedded under the configured model; with ``embedding_provider: none`` that is a
    status too (``model`` ``None``: nothing is embedded, and stored vectors wait unused)."""

    model: str | None
    status: EmbeddingStatus | None
    """``None`` when the storage provider keeps no vectors (the file provider)."""

    @property
    def missing(self) -> int | None:
        return None if self.model is None or self.status is None else self.status.missing(self.model)

    @property
    def embedded(self) -> int | None:
        return None if self.model is None or self.status is None else self.status.embedded(self.model)

    @property
    def other_models(self) -> dict[str, int]:
        """Valid vectors of another model (every stored vector when none is configured)."""
        return {} if self.status is None else self.status.other_models(self.model or "")

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "backend": None if self.status is None else self.status.backend,
            "live_facts": None if self.status is None else self.status.live_facts,
            "embedded": self.embedded,
            "missing": self.missing,
            "other_models": self.other_models,
        }


def _parts(config: MemoryConfig | None, storage: MemoryStorage | None) -> tuple[Embedder, VectorStore]:
    parts = semantic_parts(config or get_memory_config(), storage or get_memory_storage())
    if parts is None:
        raise ConfigError(NO_EMBEDDINGS)
    return parts


def embedding_report(
    *, config: MemoryConfig | None = None, storage: MemoryStorage | None = None
) -> EmbeddingReport:
    """The configured model, and how many live facts have a valid vector under it.

    Without an embedding provider it still answers (``model`` ``None``): "embeddings are off" is
    what ``memstore embed --status`` reports then, with any vectors a former model left.
    """
    config, storage = config or get_memory_config(), storage or get_memory_storage()
    parts = semantic_parts(config, storage)
    if parts is None:
        store = vector_store_of(storage)
        return EmbeddingReport(None, None if store is None else store.status())
    embedder, vectors = parts
    return EmbeddingReport(embedder.model, vectors.status())


def embed_facts(
    *,
    rebuild: bool = False,
    config: MemoryConfig | None = None,
    storage: MemoryStorage | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Embed every live fact without a valid vector (every live fact with ``rebuild``).

    Returns how many were embedded; ``progress`` is called with each round's count. A fact that
    changes while its text is with the endpoint keeps no vector and is picked up by the next run.
    """
    embedder, store = _parts(config, storage)
    after = 0
    done = 0
    while facts := store.unembedded_facts(embedder.model, limit=EMBED_BATCH, after=after, rebuild=rebuild):
        matrix = embedder.embed_documents([fact.content for fact in facts])
        by_scope: dict[tuple[str, Scope], list[tuple[str, str, np.ndarray]]] = defaultdict(list)
        for row, fact in enumerate(facts):
            key = (fact.tenant_id, (fact.user_id, fact.agent_name))
            by_scope[key].append((fact.fact_id, fact.content, matrix[row]))
        for (tenant_id, scope), items in by_scope.items():
            store.for_identity(Identity(tenant_id)).store_vectors(scope, embedder.model, items)
        after = facts[-1].row_id
        done += len(facts)
        if progress is not None:
            progress(len(facts))
    return done
