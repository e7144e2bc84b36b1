"""The two touch points of a gateway's agent loop: inject memory before, capture the turn after.

Framework-neutral: call ``memory_context`` when building the prompt and ``after_agent`` with
the thread's messages when the run ends. Neither may break the request, so both log and
carry on when memory fails, with one exception: a setup that cannot work (a schema behind
head, settings that name no usable storage) raises from ``memory_context``, the first call to
open the store, so an unmigrated deployment fails at once with the command that fixes it instead
of running every turn without memory. Neither may stall the request either: ``after_agent`` only queues, and
``memory_context`` reads the store on a small pool and gives up after
``memory_context_timeout_seconds`` (a hung database costs one turn without memory, not a hung
request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from memstore.async_face import awaited_within, limited_on_loop, loop_resource
from memstore.capture.conversation import ConversationContext, capture_conversation
from memstore.config import MemoryConfig, get_memory_config, ignored_env_settings
from memstore.errors import SETUP_ERRORS, StorageUnavailableError
from memstore.gateway.compose import compose_memory_block
from memstore.gateway.session_hooks import EMPTY_CONTEXT, abounded, bounded, record_exchange
from memstore.gateway.user_context import effective_roles, effective_tenant, get_effective_user_id
from memstore.inject.session_context import SessionContext
from memstore.ops import sessions
from memstore.queue import get_memory_queue, queue_failure
from memstore.scope import Identity, validate_tenant_id
from memstore.storage.loader import get_memory_storage

logger = logging.getLogger(__name__)


CONTEXT_READS = 4
"""Memory-context reads at once: each is a cheap query and some CPU, so a few at a time serve a
burst best (the rest queue, inside their own timeout): the sync face's pool threads, the async
face's slots per event loop."""
_CONTEXT_EXECUTOR = ThreadPoolExecutor(max_workers=CONTEXT_READS, thread_name_prefix="memstore-context")


class MemoryMiddleware:
    """Per-agent memory hooks; ``config`` defaults to the process-wide one, read per call."""

    def __init__(
        self,
        agent_name: str | None = None,
        config: MemoryConfig | None = None,
        *,
        session_memory: bool = False,
    ) -> None:
        """``session_memory``: ``after_agent`` also records each exchange in the session named by
        the thread id (short-term memory; read it back with ``session_context``)."""
        self._agent_name = agent_name
        self._config = config
        self._session_memory = session_memory
        ignored = ignored_env_settings(config) if config is not None else []
        if ignored:
            logger.warning(
                "memstore: this MemoryConfig was built in code and ignores %s; build it with "
                "memstore.load_memory_config(**settings) to read the environment too",
                ", ".join(ignored),
            )

    @property
    def agent_name(self) -> str | None:
        return self._agent_name

    def _current_config(self) -> MemoryConfig:
        return self._config or get_memory_config()

    def after_agent(
        self,
        messages: Iterable[Any],
        *,
        thread_id: str,
        user_id: str | None = None,
        tenant_id: str | None = None,
        roles: Iterable[str] | None = None,
    ) -> None:
        """Queue the thread's conversation for a memory update without waiting for it.

        The user and tenant are resolved here, on the request, because the queue's worker thread
        does not see the request's ContextVar. ``roles`` are checked but not queued: the update
        writes private facts of the user's own scope, which no role changes.
        """
        config = self._current_config()
        if not config.enabled or not thread_id:
            return
        record = self._session_memory and self._exchange_recorder(
            config, messages, thread_id, user_id, tenant_id
        )
        if record:
            bounded(_CONTEXT_EXECUTOR, config, record, doing="record the session turn", fallback=None)
        with self._queue_failures():
            context = self._captured(messages, thread_id, user_id, tenant_id, roles)
            if context is not None:
                get_memory_queue().submit(context)

    async def aafter_agent(
        self,
        messages: Iterable[Any],
        *,
        thread_id: str,
        user_id: str | None = None,
        tenant_id: str | None = None,
        roles: Iterable[str] | None = None,
    ) -> None:
        """``after_agent`` on the async face: the queue row (and the session's turn) are written on
        the event loop with the async driver, within the same bounds, no thread held."""
        config = self._current_config()
        if not config.enabled or not thread_id:
            return
        record = self._session_memory and self._exchange_recorder(
            config, messages, thread_id, user_id, tenant_id
        )
        if record:
            await abounded(config, record, doing="record the session turn", fallback=None)
        with self._queue_failures():
            context = self._captured(messages, thread_id, user_id, tenant_id, roles)
            if context is not None:
                await get_memory_queue().asubmit(context)

    def _captured(
        self,
        messages: Iterable[Any],
        thread_id: str,
        user_id: str | None,
        tenant_id: str | None,
        roles: Iterable[str] | None,
    ) -> ConversationContext | None:
        effective_roles(roles)
        return capture_conversation(
            messages,
            thread_id=thread_id,
            user_id=user_id or get_effective_user_id(),
            agent_name=self._agent_name,
            tenant_id=validate_tenant_id(effective_tenant(tenant_id)),
        )

    @contextmanager
    def _queue_failures(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            # The exception's text may name the user or the thread (an invalid id): the class only.
            logger.error(
                "could not queue a memory update (agent %s): %s", self._agent_name, queue_failure(exc)
            )

    def memory_context(
        self,
        *,
        user_id: str | None = None,
        query: str | None = None,
        tenant_id: str | None = None,
        roles: Iterable[str] | None = None,
    ) -> str:
        """The ``<memory>`` block to put in the prompt, or ``""`` when there is nothing to inject.

        With a ``query`` (the latest user message) and embeddings configured, facts are ranked by
        relevance to it (``inject.relevance``), and the top reranked when ``rerank`` is set;
        otherwise by confidence (with importance and decay, when weighted). A failure is logged and
        gives ``""``: a turn without memory, never a broken request. A setup error
        (``SchemaNotReadyError`` and the other ``MigrationError``s, ``StorageSetupError``,
        ``ConfigError``) is raised: it will not pass, and its message says what to run or set.
        """
        config = self._current_config()
        if not config.enabled or not config.injection_enabled:
            return ""
        with _without_memory_on_failure():
            return self.read_memory_context(user_id=user_id, query=query, tenant_id=tenant_id, roles=roles)
        return ""

    async def amemory_context(
        self,
        *,
        user_id: str | None = None,
        query: str | None = None,
        tenant_id: str | None = None,
        roles: Iterable[str] | None = None,
    ) -> str:
        """``memory_context`` on the async face (``memstore.async_face``): the same reads, ranking
        and failure policy, run on the event loop with the async driver instead of a pool thread."""
        config = self._current_config()
        if not config.enabled or not config.injection_enabled:
            return ""
        with _without_memory_on_failure():
            return await self.aread_memory_context(
                user_id=user_id, query=query, tenant_id=tenant_id, roles=roles
            )
        return ""

    def _exchange_recorder(
        self,
        config: MemoryConfig,
        messages: Iterable[Any],
        session_id: str,
        user_id: str | None,
        tenant_id: str | None,
    ) -> Callable[[], None] | None:
        """The call that records the exchange, with the identity resolved on the request; ``None``
        (logged) when the identity is invalid."""
        try:
            user, tenant = user_id or get_effective_user_id(), validate_tenant_id(effective_tenant(tenant_id))
        except Exception as exc:
            logger.error(
                "could not record the session turn (agent %s): %s", self._agent_name, queue_failure(exc)
            )
            return None
        history = list(messages)
        return lambda: record_exchange(
            history,
            config=config,
            session_id=session_id,
            user_id=user,
            agent_name=self._agent_name,
            tenant_id=tenant,
        )

    def session_context(
        self,
        *,
        session_id: str,
        user_id: str | None = None,
        tenant_id: str | None = None,
        max_tokens: int | None = None,
    ) -> SessionContext:
        """The session's summary and most recent turns within ``max_tokens`` (default
        ``session_context_max_tokens``) as messages for the prompt; empty on any failure (logged),
        like ``memory_context``."""
        config = self._current_config()
        if not config.enabled:
            return EMPTY_CONTEXT
        call = self._session_reader(session_id, user_id, tenant_id, max_tokens)
        return bounded(_CONTEXT_EXECUTOR, config, call, doing="read the session", fallback=EMPTY_CONTEXT)

    async def asession_context(
        self,
        *,
        session_id: str,
        user_id: str | None = None,
        tenant_id: str | None = None,
        max_tokens: int | None = None,
    ) -> SessionContext:
        """``session_context`` on the async face."""
        config = self._current_config()
        if not config.enabled:
            return EMPTY_CONTEXT
        call = self._session_reader(session_id, user_id, tenant_id, max_tokens)
        return await abounded(config, call, doing="read the session", fallback=EMPTY_CONTEXT)

    def _session_reader(
        self, session_id: str, user_id: str | None, tenant_id: str | None, max_tokens: int | None
    ) -> Callable[[], SessionContext]:
        # The identity is resolved here: neither the pool thread nor the greenlet sees it otherwise.
        user = user_id or get_effective_user_id()
        tenant = effective_tenant(tenant_id)
        return lambda: sessions.session_context(
            user, session_id, agent_name=self._agent_name, tenant_id=tenant, max_tokens=max_tokens
        )

    def read_memory_context(
        self,
        *,
        user_id: str | None = None,
        query: str | None = None,
        tenant_id: str | None = None,
        roles: Iterable[str] | None = None,
    ) -> str:
        """``memory_context`` for a caller that asked for it explicitly (a tool), so failures raise,
        and ``enabled``/``injection_enabled``, which govern automatic injection, do not apply.

        The block holds the user's own facts and, on a provider with tenants, the facts of other
        owners the identity may read (shared with it, public in its tenant), ranked together.
        A read slower than ``memory_context_timeout_seconds`` is a ``StorageUnavailableError``.
        """
        config = self._current_config()
        timeout = config.memory_context_timeout_seconds
        identity = _identity(user_id, tenant_id, roles)
        deadline = time.monotonic() + timeout
        future = _CONTEXT_EXECUTOR.submit(self._render, config, identity, query, deadline)
        try:
            return future.result(timeout=timeout)
        except TimeoutError as exc:
            future.cancel()
            raise _too_slow(timeout) from exc

    async def aread_memory_context(
        self,
        *,
        user_id: str | None = None,
        query: str | None = None,
        tenant_id: str | None = None,
        roles: Iterable[str] | None = None,
    ) -> str:
        """``read_memory_context`` on the async face: the render runs on the event loop and is
        cancelled (its reads abandoned) after ``memory_context_timeout_seconds``."""
        config = self._current_config()
        timeout = config.memory_context_timeout_seconds
        identity = _identity(user_id, tenant_id, roles)
        deadline = time.monotonic() + timeout
        slots = loop_resource("memory-context-slots", lambda: asyncio.Semaphore(CONTEXT_READS))
        try:
            # The provider is built (and an embedded database migrated) to the end, whatever the
            # deadline, as on the sync face's pool thread; then the read takes what time is left.
            await awaited_within(timeout, get_memory_storage)
            left = deadline - time.monotonic()
            return await limited_on_loop(slots, left, self._render, config, identity, query, deadline)
        except TimeoutError as exc:
            raise _too_slow(timeout) from exc

    def _render(self, config: MemoryConfig, identity: Identity, query: str | None, deadline: float) -> str:
        """Load, rank, render, and count an access of exactly the own facts the block shows."""
        storage = get_memory_storage().for_identity(identity.tenant_id, identity.roles)
        user_id = identity.user_id
        composed = compose_memory_block(storage, self._agent_name, user_id, query, config, deadline=deadline)
        if composed.fact_ids:
            storage.record_access(self._agent_name, user_id=user_id, fact_ids=composed.fact_ids)
        return composed.block


def _identity(user_id: str | None, tenant_id: str | None, roles: Iterable[str] | None) -> Identity:
    """The caller's identity, resolved on the request: the pool thread does not see its ContextVar."""
    return Identity.of(
        user_id or get_effective_user_id(),
        tenant_id=effective_tenant(tenant_id),
        roles=effective_roles(roles),
    )


def _too_slow(timeout: float) -> StorageUnavailableError:
    return StorageUnavailableError(f"memory context took longer than {timeout:.1f} s")


@contextmanager
def _without_memory_on_failure() -> Iterator[None]:
    """A failed read costs the turn its memory (logged), never the request; a setup error is raised."""
    try:
        yield
    except SETUP_ERRORS:
        raise
    except StorageUnavailableError as exc:
        logger.warning("memory store unavailable; continuing without memory: %s", exc)
    except Exception:
        logger.exception("could not build the memory context; continuing without memory")
