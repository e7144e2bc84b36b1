"""``MemoryUpdater``: load, extract, apply, save; one call per queued conversation.

The whole path is synchronous and runs on the queue's worker thread. It never creates an
event loop: when called from a thread that already runs one, it hands the work to a small
thread pool and blocks on the result, exactly like a plain sync call would. Every failure
is logged and reported as ``False`` so the queue keeps going; nothing is saved on failure.
The one exception is an unreachable store: ``StorageUnavailableError`` propagates, because
retrying later can succeed where a bad LLM reply never will, and the queue retries it. A
database whose schema is not at head (``SchemaNotReadyError``) counts as unreachable: an
operator fixes it with ``memstore db upgrade``, and the queued conversations must survive that.
``process`` is the same path without the net: the durable queue classifies its errors itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.exc import SQLAlchemyError

from memstore.capture.conversation import SESSION_COMPRESS, ConversationContext
from memstore.config import MemoryConfig, get_memory_config
from memstore.document import MemoryDocument
from memstore.embedding import Embedder
from memstore.errors import (
    ConfigError,
    EmbeddingError,
    FoldTargetGoneError,
    LLMError,
    MalformedDocumentError,
    MalformedMemoryError,
    MemstoreError,
    MigrationError,
    SchemaNotReadyError,
    StorageUnavailableError,
    StorageWriteError,
)
from memstore.metrics import EXTRACTIONS
from memstore.scope import DEFAULT_TENANT_ID, Scope, resolve_scope, scope_label
from memstore.storage.base import MemoryStorage
from memstore.storage.loader import get_memory_storage
from memstore.storage.sessions.loader import get_session_store
from memstore.storage.sql.documents.provider import SqlMemoryStorage
from memstore.storage.sql.engine import describe_db_error
from memstore.storage.sql.queue.table import QueueLease
from memstore.storage.vectors import VectorStore, semantic_parts
from memstore.update.adjudication import Adjudicate, Adjudicator
from memstore.update.apply import apply_updates
from memstore.update.extractor import (
    Extractor,
    ExtractorName,
    LLMExtractor,
    build_extractor,
    resolve_extractor,
)
from memstore.update.parser import MemoryUpdate
from memstore.update.prompt import shown_fact_ids
from memstore.update.session_compression import SessionCompressor
from memstore.update.session_summary import (
    ExtractiveSessionSummariser,
    LLMSessionSummariser,
    SessionSummariser,
)
from memstore.update.similarity import Fold, SimilarFolds, fold_similar

logger = logging.getLogger(__name__)

FOLD_ATTEMPTS = 3
"""Tries of an update whose fold target another writer deleted; the last one saves without dedup."""

# Used only when an update is requested on a thread with a running event loop.
_SYNC_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memstore-updater")


class MemoryUpdater:
    """Turns a conversation into an updated memory document for one scope."""

    def __init__(self, model_name: str | None = None, *, config: MemoryConfig | None = None) -> None:
        self._model_name = model_name
        self._config = config
        self._extractor: Extractor | None = None
        self._extractor_config: MemoryConfig | None = None
        self._extractor_lock = threading.Lock()

    @property
    def config(self) -> MemoryConfig:
        return self._config or get_memory_config()

    @property
    def extractor_name(self) -> ExtractorName:
        """The extractor the next update will use (``llm`` or ``rules``)."""
        return resolve_extractor(self.config)

    def prepare(self) -> None:
        """Build the extractor now (for the LLM: import and create the client, seconds on a cold
        process), so a queue worker pays it before it claims work rather than while holding it;
        a configuration that cannot build one raises ``ConfigError`` here."""
        self._extractor_for(self.config)

    def _extractor_for(self, config: MemoryConfig) -> Extractor:
        """The extractor for ``config``, built once and rebuilt only when the config object changes."""
        with self._extractor_lock:
            if self._extractor is None or self._extractor_config is not config:
                self._extractor = build_extractor(config, model_name=self._model_name)
                self._extractor_config = config
            return self._extractor

    def update(self, context: ConversationContext) -> bool:
        """Update the context's scope from its conversation; ``True`` once the result is saved.

        The store refuses an update for a scope erased or cleared after ``context.timestamp``.
        Raises ``StorageUnavailableError`` when the store cannot be reached or its schema is not
        at head (nothing was saved).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._update_sync(context)
        try:
            return _SYNC_EXECUTOR.submit(self._update_sync, context).result()
        except StorageUnavailableError:
            raise
        except Exception:
            logger.exception(
                "memory update for thread %s could not run off the event loop", context.thread_id
            )
            return False

    def update_memory(
        self,
        messages: Sequence[Any],
        thread_id: str | None = None,
        agent_name: str | None = None,
        correction_detected: bool = False,
        reinforcement_detected: bool = False,
        user_id: str | None = None,
        captured_at: datetime | None = None,
        *,
        tenant_id: str = DEFAULT_TENANT_ID,
    ) -> bool:
        """The reference's call shape: ``update`` for one conversation, captured now by default.

        ``captured_at`` (when the conversation was queued) lets the store refuse an update for a
        scope erased or cleared after it.
        """
        context = ConversationContext(
            thread_id or "",
            list(messages),
            agent_name,
            user_id,
            correction_detected,
            reinforcement_detected,
            tenant_id=tenant_id,
        )
        if captured_at is not None:
            context.timestamp = captured_at
        return self.update(context)

    def process(self, context: ConversationContext, lease: QueueLease | None = None) -> bool:
        """``update`` without the safety net, for a queue that decides what to retry.

        ``True`` once saved, ``False`` when the conversation holds nothing to learn. Raises
        ``StorageUnavailableError`` (an outage, or a schema not at head), ``LLMUnavailableError``
        (an endpoint failure that may pass), ``LeaseLostError`` (another worker owns ``lease``
        now), ``StaleDocumentError`` (the scope was erased or cleared after the capture), and
        any other error for a failure that retrying will not fix. With a ``lease`` (the durable
        queue's), the save completes the queued row in its own transaction.
        """
        try:
            saved = self._process(context, lease)
        except Exception:
            EXTRACTIONS.labels("failed").inc()
            raise
        EXTRACTIONS.labels("updated" if saved else "skipped").inc()
        return saved

    def _process(self, context: ConversationContext, lease: QueueLease | None) -> bool:
        config = self.config
        if config.enabled and context.kind == SESSION_COMPRESS:
            return self._compressor(config).run(context)
        if not config.enabled or not context.messages:
            return False
        try:
            # The conversation's own tenant: a worker serves every tenant, each under its identity.
            storage = get_memory_storage().for_identity(context.tenant_id)
            current = storage.load(context.agent_name, user_id=context.user_id)
            extractor = self._extractor_for(config)
            update = extractor.extract(context, current)
            if update is None:
                return False
            if lease is not None and not isinstance(storage, SqlMemoryStorage):
                raise ConfigError("the database queue needs the SQL provider (storage_class)")
            # A large scope's prompt showed a subset: the reply may only act on the facts it saw.
            shown = None
            if isinstance(extractor, LLMExtractor):
                shown = shown_fact_ids(current, context.messages, config)
            saved = self._apply_and_save(storage, context, current, update, lease, shown)
        except SchemaNotReadyError as exc:
            logger.error(
                "a memory update is kept for retry: the database schema is not ready "
                "(run `memstore db upgrade`): %s",
                exc,
            )
            raise StorageUnavailableError(
                f"the database schema is not ready (run `memstore db upgrade`): {exc}"
            ) from exc
        if not saved:
            raise StorageWriteError("the store refused the update (its log says why)")
        return True

    def _apply_and_save(
        self,
        storage: MemoryStorage,
        context: ConversationContext,
        current: MemoryDocument,
        update: MemoryUpdate,
        lease: QueueLease | None,
        shown: frozenset[str] | None = None,
    ) -> bool:
        """Apply ``update`` to ``current`` and save it, with similarity dedup when embeddings are on.

        ``shown``: the fact ids the update's prompt showed, when it showed a subset
        (``prompt.shown_fact_ids``); the reply removes, replaces and merges only those.

        A save that finds a fold target deleted by another writer meanwhile (``FoldTargetGoneError``)
        saved nothing: the update is applied again to the scope as it is now, so the other folds
        still stand; the last try goes without dedup, so the update always lands. With the LLM
        extractor, near-duplicates below the fold are adjudicated by the same endpoint
        (``adjudication.py``); the rules extractor has no model to ask, so it keeps both.
        """
        config = self.config
        scope = resolve_scope(context.agent_name, context.user_id)
        semantic = _semantic(config, storage, scope)
        adjudicate = self._adjudicator(config, scope) if semantic else None
        options: dict[str, Any] = {"origin": context.thread_id, "captured_at": context.timestamp}
        if lease is not None:
            options["lease"] = lease
        for attempt in range(FOLD_ATTEMPTS):
            last = attempt == FOLD_ATTEMPTS - 1
            fold = _folder(semantic, scope, config, adjudicate) if semantic and not last else None
            # The signals rank evictions: read them only when the update can reach the cap.
            may_evict = len(current.get("facts") or ()) + len(update["newFacts"]) > config.max_facts
            signals = storage.fact_signals(context.agent_name, user_id=context.user_id) if may_evict else {}
            applied = apply_updates(
                current,
                update,
                thread_id=context.thread_id,
                config=config,
                signals=signals,
                fold=fold,
                shown=shown,
            )
            try:
                saved = storage.save(
                    applied.memory,
                    context.agent_name,
                    user_id=context.user_id,
                    removals=applied.removals,
                    confirmed=applied.confirmed,
                    folded=applied.folds.folded,
                    **options,
                )
            except FoldTargetGoneError as exc:
                logger.info("memory update applied again: %s", exc)
                current = storage.load(context.agent_name, user_id=context.user_id)
                continue
            if saved and semantic is not None:
                _store_vectors(semantic, scope, applied.folds.vectors)
            return saved
        raise AssertionError("unreachable: the last try saves without dedup")

    def _adjudicator(self, config: MemoryConfig, scope: Scope) -> Adjudicate | None:
        """The near-duplicate adjudicator for one update, or ``None`` when there is no model to ask."""
        extractor = self._extractor_for(config)
        if config.adjudication_similarity is None or not isinstance(extractor, LLMExtractor):
            return None
        return Adjudicator(extractor.client, scope_label(scope))

    def _compressor(self, config: MemoryConfig) -> SessionCompressor:
        """Compression summarises with the extractor's endpoint, or extracts offline with the rules."""
        extractor = self._extractor_for(config)
        summariser: SessionSummariser = (
            LLMSessionSummariser(extractor.client, config)
            if isinstance(extractor, LLMExtractor)
            else ExtractiveSessionSummariser(config)
        )
        return SessionCompressor(
            get_session_store(config), summariser, lambda summary: self._process(summary, None), config
        )

    def _update_sync(self, context: ConversationContext) -> bool:
        try:
            return self.process(context)
        except StorageUnavailableError as exc:
            logger.warning("a memory update could not reach the store: %s", exc)
            raise
        except MemstoreError as exc:
            # Expected failures (bad reply, malformed stored document, config, endpoint down):
            # a traceback would only add noise on every queued update.
            logger.warning("a memory update was skipped, memory left unchanged: %s", describe_failure(exc))
            return False
        except Exception as exc:
            logger.error("a memory update failed; memory left unchanged: %s", describe_failure(exc))
            return False


def describe_failure(exc: BaseException) -> str:
    """An update's failure as a log line may show it: the message of an error about the
    environment (an endpoint, the database, the configuration) or the stored document's shape,
    only the class of any other,
    whose message may quote the conversation or the model's reply. Logs are read by people who
    may not read memory; the durable queue keeps the whole message in the row's ``last_error``."""
    if isinstance(exc, LLMError):  # its message carries the endpoint's answer, which may quote the prompt
        cause = exc.__cause__
        status = getattr(cause, "status_code", None)
        detail = f" ({type(cause).__name__}{f' {status}' if status else ''})" if cause is not None else ""
        return f"{type(exc).__name__}{detail}"
    if isinstance(
        exc,
        StorageUnavailableError
        | ConfigError
        | MigrationError
        | MalformedMemoryError
        | MalformedDocumentError,
    ):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SQLAlchemyError):
        return describe_db_error(exc)
    return type(exc).__name__


def _semantic(
    config: MemoryConfig, storage: MemoryStorage, scope: Scope
) -> tuple[Embedder, VectorStore] | None:
    """The embedder and vector store, or ``None`` (logged) when the configured provider cannot load."""
    try:
        return semantic_parts(config, storage)
    except (ConfigError, EmbeddingError) as exc:
        logger.warning(
            "similarity dedup skipped (%s), the update is saved without it: %s", scope_label(scope), exc
        )
        return None


def _folder(
    semantic: tuple[Embedder, VectorStore], scope: Scope, config: MemoryConfig, adjudicate: Adjudicate | None
) -> Fold:
    """``fold_similar`` for this scope. Dedup only saves a duplicate row, so an embedding failure
    (an endpoint down or answering nonsense) is logged and the update saved without it: the facts
    the LLM extracted are never lost to it, and their vectors are made on a later update or by
    ``memstore embed``."""
    embedder, store = semantic

    def fold(current: MemoryDocument, memory: MemoryDocument) -> SimilarFolds:
        try:
            return fold_similar(
                current,
                memory,
                embedder=embedder,
                store=store,
                scope=scope,
                config=config,
                adjudicate=adjudicate,
            )
        except EmbeddingError as exc:
            logger.warning(
                "similarity dedup skipped (%s), the update is saved without it: %s", scope_label(scope), exc
            )
            return SimilarFolds(memory)

    return fold


def _store_vectors(
    semantic: tuple[Embedder, VectorStore], scope: Scope, vectors: list[tuple[str, str, np.ndarray]]
) -> None:
    """Store the vectors made for the update; the update is saved, so failing here only logs
    (facts without a vector are still served, and ``memstore embed`` fills them in)."""
    embedder, store = semantic
    try:
        store.store_vectors(scope, embedder.model, vectors)
    except MemstoreError as exc:
        logger.warning("fact vectors (%s) not stored (run `memstore embed`): %s", scope_label(scope), exc)


def update_memory_from_conversation(
    messages: Sequence[Any],
    thread_id: str | None = None,
    agent_name: str | None = None,
    correction_detected: bool = False,
    reinforcement_detected: bool = False,
    user_id: str | None = None,
    *,
    tenant_id: str = DEFAULT_TENANT_ID,
) -> bool:
    """One-shot convenience (the reference's function): a ``MemoryUpdater`` with the global config."""
    return MemoryUpdater().update_memory(
        messages,
        thread_id,
        agent_name,
        correction_detected,
        reinforcement_detected,
        user_id,
        tenant_id=tenant_id,
    )
