"""Memory for LangChain v1 agents built with ``create_agent``.

The ``<memory>`` block is added to each model request only (``wrap_model_call``), never to the
graph state, so it is not checkpointed and never fed back into memory as conversation. After
the run, ``after_agent`` queues the thread with the user resolved on the request, because the
queue's worker thread cannot see the run's context. The async hooks (``awrap_model_call``,
``aafter_agent``, used by ``ainvoke``/``astream``) await the async face
(``MemoryMiddleware.amemory_context``/``aafter_agent``): no thread is taken per model call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

try:
    from langchain.agents.middleware import (
        AgentMiddleware,
        AgentState,
        ModelCallResult,
        ModelRequest,
        ModelResponse,
    )
    from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
    from langgraph.config import get_config
    from langgraph.runtime import Runtime
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without the extra
    raise ImportError(
        "memstore.integrations.langchain needs LangChain v1: pip install 'memstore[langchain]'"
    ) from exc

from memstore.capture.filtering import latest_user_text
from memstore.config import MemoryConfig
from memstore.gateway.middleware import MemoryMiddleware
from memstore.inject.session_context import SessionContext

UserResolver = Callable[[Runtime[Any]], str | None]
"""Maps a run's ``Runtime`` to a memstore user id (or tenant id); ``None`` falls back to
``set_current_user``."""
RolesResolver = Callable[[Runtime[Any]], Iterable[str] | None]
"""Maps a run's ``Runtime`` to the caller's roles; ``None`` falls back to ``set_current_user``."""

__all__ = [
    "LangChainMemoryMiddleware",
    "RolesResolver",
    "UserResolver",
    "roles_from_context",
    "tenant_id_from_context",
    "user_id_from_context",
]


def _context_value(runtime: Runtime[Any], key: str) -> object:
    context = runtime.context
    return context.get(key) if isinstance(context, Mapping) else getattr(context, key, None)


def user_id_from_context(runtime: Runtime[Any]) -> str | None:
    """``user_id`` of the run's context, whether a mapping (``context={...}``) or an object."""
    value = _context_value(runtime, "user_id")
    return value if isinstance(value, str) and value else None


def tenant_id_from_context(runtime: Runtime[Any]) -> str | None:
    """``tenant_id`` of the run's context, as ``user_id_from_context`` reads ``user_id``."""
    value = _context_value(runtime, "tenant_id")
    return value if isinstance(value, str) and value else None


def roles_from_context(runtime: Runtime[Any]) -> Iterable[str] | None:
    """``roles`` of the run's context (a list of role names); anything else is no answer."""
    value = _context_value(runtime, "roles")
    return value if isinstance(value, list | tuple | frozenset | set) else None


def _thread_id() -> str | None:
    thread_id = get_config().get("configurable", {}).get("thread_id")
    return str(thread_id) if thread_id else None


def _with_memory(messages: list[AnyMessage], block: str) -> list[AnyMessage]:
    """Insert the block as user-role context just before the latest user message.

    User role, as in the reference: the memory is user-managed data, not system instructions.
    """
    memory = HumanMessage(content=block.strip(), additional_kwargs={"hide_from_ui": True})
    last_human = max((i for i, message in enumerate(messages) if message.type == "human"), default=0)
    return [*messages[:last_human], memory, *messages[last_human:]]


def _with_session(messages: list[AnyMessage], context: SessionContext) -> list[AnyMessage]:
    """The session's summary and recent turns in place of the history before the latest user
    message: the session holds those turns, compressed, so the prompt stays bounded. A session
    that does not end with the thread's last earlier message (a recording that failed or was
    refused) is behind the thread: the thread's own history is sent instead."""
    last_human = max((i for i, message in enumerate(messages) if message.type == "human"), default=0)
    earlier_turns = [message for message in messages[:last_human] if message.type in _SESSION_ROLES]
    if context.turns and earlier_turns:
        newest, recorded = earlier_turns[-1], context.turns[-1]
        if (_SESSION_ROLES[newest.type], newest.text.strip()) != (recorded.role, recorded.content):
            return messages
    classes = {"user": HumanMessage, "assistant": AIMessage, "system": SystemMessage}
    earlier: list[AnyMessage] = [
        classes[message["role"]](content=message["content"])
        for message in context.messages
        if message["role"] in classes
    ]
    return [*earlier, *messages[last_human:]]


_SESSION_ROLES = {"human": "user", "ai": "assistant"}


def _composed(request: ModelRequest[Any], block: str, session: SessionContext | None) -> ModelRequest[Any]:
    """The request with the session in place of the earlier history and the memory block added."""
    messages = request.messages
    if session is not None and session.messages:
        messages = _with_session(messages, session)
    if block:
        messages = _with_memory(messages, block)
    return request if messages is request.messages else request.override(messages=messages)


class LangChainMemoryMiddleware(AgentMiddleware[AgentState[Any], Any]):
    """Pass to ``create_agent(middleware=[...])``; invoke with ``configurable.thread_id`` set.

    The user comes from ``user_resolver(runtime)`` (default: ``runtime.context["user_id"]`` or
    ``runtime.context.user_id``), else from ``memstore.set_current_user``, else ``"default"``; the
    tenant and roles likewise (``tenant_id`` and ``roles`` of the context), else the bound ones,
    else the default tenant with no roles.

    With ``session_memory=True`` each run's exchange is also recorded in the session of the
    thread id, and each model call sends the session's summary and recent turns in place of the
    thread's earlier messages (the ones before the latest user message).
    """

    def __init__(
        self,
        agent_name: str | None = None,
        *,
        config: MemoryConfig | None = None,
        user_resolver: UserResolver = user_id_from_context,
        tenant_resolver: UserResolver = tenant_id_from_context,
        roles_resolver: RolesResolver = roles_from_context,
        session_memory: bool = False,
    ) -> None:
        super().__init__()
        self._memory = MemoryMiddleware(agent_name, config, session_memory=session_memory)
        self._session_memory = session_memory
        self._resolve_user = user_resolver
        self._resolve_tenant = tenant_resolver
        self._resolve_roles = roles_resolver

    def _reads(self, request: ModelRequest[Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """What the model call reads, for the caller's identity: the memory block's arguments and,
        with session memory and a thread, the session's (``None``: no session to read)."""
        runtime = request.runtime
        user, tenant = self._resolve_user(runtime), self._resolve_tenant(runtime)
        memory = {
            "user_id": user,
            "query": latest_user_text(request.messages),
            "tenant_id": tenant,
            "roles": self._resolve_roles(runtime),
        }
        thread_id = _thread_id()
        session = (
            {"session_id": thread_id, "user_id": user, "tenant_id": tenant}
            if self._session_memory and thread_id
            else None
        )
        return memory, session

    def _request_with_memory(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        memory, session = self._reads(request)
        block = self._memory.memory_context(**memory)
        context = None if session is None else self._memory.session_context(**session)
        return _composed(request, block, context)

    async def _arequest_with_memory(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """``_request_with_memory`` on the async face: the reads are awaited on the event loop."""
        memory, session = self._reads(request)
        block = await self._memory.amemory_context(**memory)
        context = None if session is None else await self._memory.asession_context(**session)
        return _composed(request, block, context)

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelCallResult[Any]:
        return handler(self._request_with_memory(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelCallResult[Any]:
        return await handler(await self._arequest_with_memory(request))

    def after_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        thread_id = _thread_id()
        if thread_id:
            self._memory.after_agent(
                state["messages"],
                thread_id=thread_id,
                user_id=self._resolve_user(runtime),
                tenant_id=self._resolve_tenant(runtime),
                roles=self._resolve_roles(runtime),
            )
        return None

    async def aafter_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        thread_id = _thread_id()
        if thread_id:
            await self._memory.aafter_agent(
                state["messages"],
                thread_id=thread_id,
                user_id=self._resolve_user(runtime),
                tenant_id=self._resolve_tenant(runtime),
                roles=self._resolve_roles(runtime),
            )
        return None
