"""``MemoryUpdater``: load, extract, apply, save; one call per queued conversation.

The whole path is synchronous and runs on the queue's worker thread. It never creates an
event loop: when called from a thread that already runs one, it hands the work to a small
thread pool and blocks on the result, exactly like a plain sync call would. Every failure
is logged and reported as ``False`` so the queue keeps going; nothing is saved on failure.
The one exception is an unreachable store: ``StorageUnavailableError`` propagates, because
retrying later can succeed where a bad LLM reply never will, and the queue retries it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Literal

from memstore.config import MemoryConfig, get_memory_config
from memstore.errors import ConfigError, MemstoreError, StorageUnavailableError
from memstore.llm import LLMClient
from memstore.rules_extractor import extract_update
from memstore.storage.loader import get_memory_storage
from memstore.update_apply import apply_updates
from memstore.update_parser import parse_update_response
from memstore.update_prompt import build_update_prompt

logger = logging.getLogger(__name__)

ExtractorName = Literal["llm", "rules"]

# Used only when update_memory is called on a thread with a running event loop.
_SYNC_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="memstore-updater")


def resolve_extractor(config: MemoryConfig) -> ExtractorName:
    """Which extractor ``config`` selects; ``auto`` means the LLM whenever an endpoint or key is set."""
    has_endpoint = bool(config.llm_base_url) or config.llm_api_key is not None
    if config.extractor == "rules":
        return "rules"
    if config.extractor == "llm":
        if not has_endpoint:
            raise ConfigError("extractor is 'llm' but neither llm_base_url nor llm_api_key is configured")
        return "llm"
    return "llm" if has_endpoint else "rules"


def describe_extractor(config: MemoryConfig) -> str:
    """A one-line, secret-free description of the extractor ``config`` selects."""
    if resolve_extractor(config) == "rules":
        return "rule-based (offline, explicit statements only; lower recall than an LLM)"
    endpoint = config.llm_base_url or "the OpenAI API"
    return f"LLM {config.model_name or '(model_name not set)'} at {endpoint}"


class MemoryUpdater:
    """Turns a conversation into an updated memory document for one scope."""

    def __init__(self, model_name: str | None = None, *, config: MemoryConfig | None = None) -> None:
        self._model_name = model_name
        self._config = config
        self._client: LLMClient | None = None
        self._client_config: MemoryConfig | None = None
        self._client_lock = threading.Lock()

    @property
    def config(self) -> MemoryConfig:
        return self._config or get_memory_config()

    @property
    def extractor_name(self) -> ExtractorName:
        """The extractor the next update will use (``llm`` or ``rules``)."""
        return resolve_extractor(self.config)

    def _llm_client(self, config: MemoryConfig) -> LLMClient:
        """The client for ``config``, built once and rebuilt only when the config object changes."""
        with self._client_lock:
            if self._client is None or self._client_config is not config:
                self._client = LLMClient(config, model_name=self._model_name)
                self._client_config = config
            return self._client

    def update_memory(
        self,
        messages: Sequence[Any],
        thread_id: str | None = None,
        agent_name: str | None = None,
        correction_detected: bool = False,
        reinforcement_detected: bool = False,
        user_id: str | None = None,
        captured_at: datetime | None = None,
    ) -> bool:
        """Update the scope's memory from ``messages``; ``True`` once the result is saved.

        ``captured_at`` (when the conversation was queued) lets the store refuse an update
        for a scope that was erased or cleared after the conversation was captured. Raises
        ``StorageUnavailableError`` when the store cannot be reached (nothing was saved).
        """
        args = (
            messages,
            thread_id,
            agent_name,
            correction_detected,
            reinforcement_detected,
            user_id,
            captured_at,
        )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._update_sync(*args)
        try:
            return _SYNC_EXECUTOR.submit(self._update_sync, *args).result()
        except StorageUnavailableError:
            raise
        except Exception:
            logger.exception("memory update for thread %s could not run off the event loop", thread_id)
            return False

    def _update_sync(
        self,
        messages: Sequence[Any],
        thread_id: str | None,
        agent_name: str | None,
        correction_detected: bool,
        reinforcement_detected: bool,
        user_id: str | None,
        captured_at: datetime | None,
    ) -> bool:
        try:
            config = self.config
            if not config.enabled or not messages:
                return False
            storage = get_memory_storage()
            current = storage.load(agent_name, user_id=user_id)
            prompt = build_update_prompt(
                current,
                messages,
                correction_detected=correction_detected,
                reinforcement_detected=reinforcement_detected,
            )
            if prompt is None:
                return False
            if resolve_extractor(config) == "llm":
                reply = self._llm_client(config).complete(prompt)
            else:
                reply = extract_update(messages, current, correction_detected=correction_detected)
            update = parse_update_response(reply)
            updated = apply_updates(current, update, thread_id=thread_id, config=config)
            saved = storage.save(
                updated, agent_name, user_id=user_id, origin=thread_id, captured_at=captured_at
            )
            if not saved:
                logger.warning("memory update for thread %s was not saved (storage refused)", thread_id)
                return False
            return True
        except StorageUnavailableError as exc:
            logger.warning("memory update for thread %s could not reach the store: %s", thread_id, exc)
            raise
        except MemstoreError as exc:
            # Expected failures (bad reply, malformed stored document, config, endpoint down)
            # carry a clear message; a traceback would only add noise on every queued update.
            logger.warning("memory update for thread %s skipped, memory left unchanged: %s", thread_id, exc)
            return False
        except Exception:
            logger.exception("memory update for thread %s failed; memory left unchanged", thread_id)
            return False


def update_memory_from_conversation(
    messages: Sequence[Any],
    thread_id: str | None = None,
    agent_name: str | None = None,
    correction_detected: bool = False,
    reinforcement_detected: bool = False,
    user_id: str | None = None,
) -> bool:
    """One-shot convenience: ``MemoryUpdater().update_memory(...)`` with the global config."""
    return MemoryUpdater().update_memory(
        messages,
        thread_id=thread_id,
        agent_name=agent_name,
        correction_detected=correction_detected,
        reinforcement_detected=reinforcement_detected,
        user_id=user_id,
    )
