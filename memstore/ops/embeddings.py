"""Embedding every live fact, and what the vector table holds, for ``memstore embed`` and imports.

The queue worker embeds a scope's new facts right after each update, so this is for what it did
not see: facts from before embeddings were configured, imports (``scopes``: only the imported
ones), manual edits on another provider's schedule, and a model change (``rebuild``), which
leaves every stored vector invalid.

Throughput (docs/performance.md, "Embedding throughput"): facts are read ``EMBED_BATCH`` at a
time; a round is embedded while the one before is written on a thread of its own, and an HTTP
endpoint gets ``concurrency`` requests at once. At most two rounds are held in memory.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, suppress
from dataclasses import dataclass

import numpy as np

from memstore.config import MemoryConfig, get_memory_config
from memstore.embedding import Embedder
from memstore.errors import ConfigError, EmbeddingError
from memstore.scope import Identity, Scope
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.vectors import (
    EmbeddingStatus,
    UnembeddedFact,
    VectorStore,
    semantic_parts,
    vector_store_of,
)

EMBED_BATCH = 256
"""Facts read and embedded per round (an HTTP endpoint gets them in ``embedding_batch_size`` requests)."""


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
    scopes: Iterable[Scope] | None = None,
) -> int:
    """Embed every live fact without a valid vector (every live fact with ``rebuild``).

    ``scopes`` restricts it to those scopes of ``storage``'s tenant (what an import wrote); a
    rebuild covers every scope. Returns how many were embedded; ``progress`` is called with each
    round's count once its vectors are written. A fact that changes while its text is with the
    endpoint keeps no vector and is picked up by the next run.
    """
    if rebuild and scopes is not None:
        raise ValueError("a rebuild re-embeds every scope: pass no scopes")
    embedder, store = _parts(config, storage)
    if scopes is None:
        rounds = _every_round(store, embedder.model, rebuild=rebuild)
    else:
        rounds = _scope_rounds(store, embedder.model, list(dict.fromkeys(scopes)))
    return _embed_rounds(embedder, store, rounds, progress)


def count_missing(
    scopes: Iterable[Scope], *, config: MemoryConfig | None = None, storage: MemoryStorage | None = None
) -> int:
    """How many live facts of ``scopes`` (in ``storage``'s tenant) lack a valid vector.

    It reads the rows ``embed_facts(scopes=...)`` will read, a round at a time: well under a
    second for thousands of facts, against minutes to embed them, and it lets a progress bar
    show a total.
    """
    embedder, store = _parts(config, storage)
    return sum(len(facts) for facts in _scope_rounds(store, embedder.model, list(dict.fromkeys(scopes))))


def _every_round(store: VectorStore, model: str, *, rebuild: bool) -> Iterator[list[UnembeddedFact]]:
    after = 0
    while facts := store.unembedded_facts(model, limit=EMBED_BATCH, after=after, rebuild=rebuild):
        yield facts
        after = facts[-1].row_id


def _scope_rounds(store: VectorStore, model: str, scopes: list[Scope]) -> Iterator[list[UnembeddedFact]]:
    """Rounds of ``EMBED_BATCH`` facts, filled across scopes, so small scopes still make full batches."""
    waiting: list[UnembeddedFact] = []
    for scope in scopes:
        after = 0
        while facts := store.unembedded_facts(model, limit=EMBED_BATCH, after=after, scope=scope):
            waiting.extend(facts)
            after = facts[-1].row_id
            while len(waiting) >= EMBED_BATCH:
                yield waiting[:EMBED_BATCH]
                waiting = waiting[EMBED_BATCH:]
    if waiting:
        yield waiting


def _embed_rounds(
    embedder: Embedder,
    store: VectorStore,
    rounds: Iterator[list[UnembeddedFact]],
    progress: Callable[[int], None] | None,
) -> int:
    """Embed each round while the one before is written, on a thread of its own.

    The endpoint or the model is the slow part; the write (one transaction per scope) overlaps
    it instead of following it. At most two rounds are held: one embedding, one being written.
    """
    with ExitStack() as stack:
        embed = _round_embedder(embedder, stack)
        writer = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="memstore-embed-write"))
        return _pipelined(embed, embedder.model, store, rounds, writer, progress)


def _round_embedder(embedder: Embedder, stack: ExitStack) -> Callable[[list[str]], np.ndarray]:
    """How a round's texts are embedded: in one call, or, for a provider that says it serves
    several calls at once (``concurrency``, an HTTP endpoint), in ``batch_size`` calls that many
    at a time. The pool lives for one run, so nothing idles between runs."""
    concurrency = int(getattr(embedder, "concurrency", 1))
    size = int(getattr(embedder, "batch_size", 0))
    if concurrency <= 1 or size <= 0:
        return embedder.embed_documents
    pool = stack.enter_context(ThreadPoolExecutor(concurrency, thread_name_prefix="memstore-embed"))

    def embed(texts: list[str]) -> np.ndarray:
        parts = list(
            pool.map(embedder.embed_documents, [texts[s : s + size] for s in range(0, len(texts), size)])
        )
        if len({part.shape[1] for part in parts}) > 1:
            raise EmbeddingError(
                "the embeddings endpoint returned vectors of different lengths across batches"
            )
        return np.concatenate(parts)

    return embed


def _pipelined(
    embed: Callable[[list[str]], np.ndarray],
    model: str,
    store: VectorStore,
    rounds: Iterator[list[UnembeddedFact]],
    writer: ThreadPoolExecutor,
    progress: Callable[[int], None] | None,
) -> int:
    done = 0
    pending: tuple[Future[None], int] | None = None

    def settle() -> None:
        nonlocal done, pending
        if pending is None:
            return
        future, count = pending
        pending = None
        future.result()
        done += count
        if progress is not None:
            progress(count)

    try:
        for facts in rounds:
            matrix = embed([fact.content for fact in facts])
            settle()
            pending = (writer.submit(_store_round, store, model, facts, matrix), len(facts))
        settle()
    except BaseException:
        with suppress(Exception):  # the failure being raised is the one to report
            settle()  # the round already embedded is kept, and counted, when its write succeeds
        raise
    return done


def _store_round(store: VectorStore, model: str, facts: list[UnembeddedFact], matrix: np.ndarray) -> None:
    by_scope: dict[tuple[str, Scope], list[tuple[str, str, np.ndarray]]] = defaultdict(list)
    for row, fact in enumerate(facts):
        key = (fact.tenant_id, (fact.user_id, fact.agent_name))
        by_scope[key].append((fact.fact_id, fact.content, matrix[row]))
    for (tenant_id, scope), items in by_scope.items():
        store.for_identity(Identity(tenant_id)).store_vectors(scope, model, items)
