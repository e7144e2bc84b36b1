"""The agent's own memory document for LangChain v1 agents built with ``create_agent``.

``AgentDocMiddleware`` loads ``/memories/agent.md`` once per conversation into the graph state
(``before_agent``), sends every model call the three-layer system prompt built from it
(``wrap_model_call``: the ``<agent_memory>`` section, the agent's own system prompt, the memory
guide), and gives the agent the five file tools over its ``/memories/`` documents. The tools act
in the run's scope, resolved from the run's context as ``LangChainMemoryMiddleware`` resolves it;
their schemas have no user, tenant or agent argument, so the model cannot name another scope.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, NotRequired

try:
    from langchain.agents.middleware import (
        AgentMiddleware,
        AgentState,
        ModelCallResult,
        ModelRequest,
        ModelResponse,
    )
    from langchain.agents.middleware.types import OmitFromInput
    from langchain.tools import ToolRuntime
    from langchain_core.messages import SystemMessage
    from langchain_core.tools import BaseTool, StructuredTool
    from langgraph.runtime import Runtime
except ImportError as exc:  # pragma: no cover - exercised in a subprocess without the extra
    raise ImportError(
        "memstore.integrations.langchain_agent_doc needs LangChain v1: pip install 'memstore[langchain]'"
    ) from exc

from memstore.agent_doc import DOC_ROOT
from memstore.async_face import run_on_loop
from memstore.gateway import agent_doc_tools
from memstore.gateway.agent_doc_prompt import (
    STATE_KEY,
    AgentMemory,
    kept_agent_system_prompt,
    load_agent_memory,
)
from memstore.integrations.langchain import UserResolver, tenant_id_from_context, user_id_from_context

__all__ = ["AgentDocMiddleware", "AgentDocState"]


class AgentDocState(AgentState[Any]):
    """The agent state with the conversation's copy of its memory document."""

    agent_memory: Annotated[NotRequired[AgentMemory], OmitFromInput]


Scope = Callable[[ToolRuntime[Any, Any]], dict[str, str | None]]


def _file_tools(scope: Scope) -> list[BaseTool]:
    """``agent_doc_tools``' five functions as LangChain tools, each in the scope of the run that
    calls it: LangChain injects ``runtime`` and leaves it out of the schema the model sees."""

    def ls(path: str = DOC_ROOT, *, runtime: ToolRuntime[Any, Any]) -> str:
        return agent_doc_tools.ls(path, **scope(runtime))

    def read_file(
        file_path: str,
        offset: int = 0,
        limit: int = agent_doc_tools.MAX_READ_LINES,
        *,
        runtime: ToolRuntime[Any, Any],
    ) -> str:
        return agent_doc_tools.read_file(file_path, offset, limit, **scope(runtime))

    def write_file(
        file_path: str, content: str, version: int | None = None, *, runtime: ToolRuntime[Any, Any]
    ) -> str:
        return agent_doc_tools.write_file(file_path, content, version, **scope(runtime))

    def edit_file(
        file_path: str,
        old_string: str,
        new_string: str,
        version: int | None = None,
        *,
        runtime: ToolRuntime[Any, Any],
    ) -> str:
        return agent_doc_tools.edit_file(file_path, old_string, new_string, version, **scope(runtime))

    def delete_file(file_path: str, version: int | None = None, *, runtime: ToolRuntime[Any, Any]) -> str:
        return agent_doc_tools.delete_file(file_path, version, **scope(runtime))

    wrappers: tuple[Callable[..., str], ...] = (ls, read_file, write_file, edit_file, delete_file)
    tools: list[BaseTool] = []
    for wrapper, face in zip(wrappers, agent_doc_tools.FILE_TOOLS, strict=True):
        wrapper.__doc__ = face.__doc__  # one wording for every entry point, with its Args
        tools.append(StructuredTool.from_function(wrapper, name=face.__name__, parse_docstring=True))
    return tools


class AgentDocMiddleware(AgentMiddleware[AgentDocState, Any]):
    """Pass to ``create_agent(middleware=[...])``; adds the file tools itself.

    ``agent_name`` names whose documents these are. The user and tenant of each run come from
    ``user_resolver(runtime)`` and ``tenant_resolver(runtime)`` (default: ``user_id`` and
    ``tenant_id`` of the run's context), else from ``memstore.set_current_user``; the user
    matters for per-user documents (``agent_doc_per_user``) and is recorded as the actor of
    each change. With a checkpointer the document is loaded once per thread; without one, once
    per run.
    """

    state_schema = AgentDocState

    def __init__(
        self,
        agent_name: str | None = None,
        *,
        user_resolver: UserResolver = user_id_from_context,
        tenant_resolver: UserResolver = tenant_id_from_context,
    ) -> None:
        super().__init__()
        self._agent_name = agent_name
        self._resolve_user = user_resolver
        self._resolve_tenant = tenant_resolver
        self.tools = _file_tools(self._tool_scope)

    def _scope(self, runtime: Runtime[Any]) -> dict[str, str | None]:
        return {
            "agent_name": self._agent_name,
            "user_id": self._resolve_user(runtime),
            "tenant_id": self._resolve_tenant(runtime),
        }

    def _tool_scope(self, runtime: ToolRuntime[Any, Any]) -> dict[str, str | None]:
        return self._scope(Runtime(context=runtime.context, store=runtime.store))

    def before_agent(self, state: AgentDocState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        if STATE_KEY in state:
            return None
        loaded: dict[str, Any] = {}
        load_agent_memory(loaded, **self._scope(runtime))
        return loaded or None  # nothing kept after a failed load: the next run tries again

    async def abefore_agent(self, state: AgentDocState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        # The read runs on the event loop with the async driver (memstore.async_face).
        return await run_on_loop(self.before_agent, state, runtime)

    def _request_with_prompt(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        prompt = kept_agent_system_prompt(request.system_prompt, request.state)
        return request.override(system_message=SystemMessage(content=prompt))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelCallResult[Any]:
        return handler(self._request_with_prompt(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelCallResult[Any]:
        return await handler(self._request_with_prompt(request))
