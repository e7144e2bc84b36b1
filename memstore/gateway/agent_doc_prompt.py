"""The agent's memory document in the system prompt, for any gateway: load it once per
conversation, build the three-layer prompt, count it.

A gateway keeps one mutable mapping per conversation (its state) and calls
:func:`load_agent_memory` before the agent runs, then :func:`agent_system_prompt` for each model
call; :func:`agent_prompt_baseline_tokens` counts the same prompt for budgeting. The LangChain
middleware (``integrations/langchain_agent_doc.py``) does exactly this with the graph state.

The document is read once and kept: the prompt stays the same for the whole conversation (and
provider prompt caches keep working), while the agent's own edits reach it through ``read_file``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import Any, TypedDict

from memstore.agent_doc import MAIN_DOC_PATH
from memstore.config import get_memory_config
from memstore.errors import SETUP_ERRORS, StorageUnavailableError
from memstore.gateway.deadline import within
from memstore.gateway.user_context import effective_tenant, get_effective_user_id
from memstore.inject.agent_prompt import build_agent_system_prompt
from memstore.inject.tokens import count_tokens
from memstore.ops import agent_docs

logger = logging.getLogger(__name__)

STATE_KEY = "agent_memory"


class AgentMemory(TypedDict):
    """What a conversation keeps of ``/memories/agent.md``: its text and version when loaded
    (``""`` and ``0`` when the agent has none yet)."""

    content: str
    version: int
    path: str


def _empty() -> AgentMemory:
    return AgentMemory(content="", version=0, path=MAIN_DOC_PATH)


def read_agent_memory(
    *, agent_name: str | None, user_id: str | None = None, tenant_id: str | None = None
) -> AgentMemory:
    """The main document as stored now, in the user's scope (``set_current_user`` by default).

    Raises what the store raises; :func:`load_agent_memory` decides what a failure costs.
    """
    actor = user_id or get_effective_user_id()
    scope = agent_docs.doc_scope(agent_name, actor, effective_tenant(tenant_id))
    doc = agent_docs.load_main_doc(scope, actor=actor)
    if doc is None:
        return _empty()
    return AgentMemory(content=doc.content or "", version=doc.version, path=doc.path)


def load_agent_memory(
    state: MutableMapping[str, Any],
    *,
    agent_name: str | None,
    user_id: str | None = None,
    tenant_id: str | None = None,
) -> AgentMemory:
    """Load the main document into ``state["agent_memory"]`` unless it is already there, and
    return what the state keeps; loading again is a no-op that reads nothing.

    A failure never breaks the agent's run and never costs data. The database unreachable or
    not answering within ``memory_context_timeout_seconds`` (logged at WARNING) or any other read
    failure (logged with its traceback) gives an empty document for this run *without* keeping it
    in ``state``, so the next run of the conversation loads again instead of carrying an empty
    memory to its end. Nothing can be
    overwritten meanwhile: the agent's ``write_file`` without a version only creates, and its
    edits need the version ``read_file`` reports. A setup that cannot work (``SchemaNotReadyError``
    and the other migration errors, ``StorageSetupError``, ``ConfigError`` such as a storage that
    is not SQL) is raised, as ``MemoryMiddleware.memory_context`` raises it: no retry fixes it.
    """
    kept: AgentMemory | None = state.get(STATE_KEY)
    if kept is not None:
        return kept
    try:
        memory = within(
            get_memory_config().memory_context_timeout_seconds,
            lambda: read_agent_memory(agent_name=agent_name, user_id=user_id, tenant_id=tenant_id),
            doing="load the agent's memory document",
        )
    except SETUP_ERRORS:
        raise
    except StorageUnavailableError as exc:
        logger.warning("agent memory store unavailable; this run goes without its document: %s", exc)
    except Exception:
        logger.exception("could not load the agent's memory document; this run goes without it")
    else:
        state[STATE_KEY] = memory
        return memory
    return _empty()


def kept_agent_system_prompt(system_prompt: str | None, state: Mapping[str, Any]) -> str:
    """The three-layer prompt from the document ``state`` keeps (an empty section when it keeps
    none), never reading the store: what each model call of the conversation is sent.

    The guide is the read-only one when ``agent_doc_agent_writes`` is off, and the per-user one
    with ``agent_doc_per_user``.
    """
    kept: AgentMemory | None = state.get(STATE_KEY)
    document = kept["content"] if kept is not None else ""
    config = get_memory_config()
    return build_agent_system_prompt(
        document, system_prompt, writable=config.agent_doc_agent_writes, per_user=config.agent_doc_per_user
    )


def agent_system_prompt(
    system_prompt: str | None,
    *,
    agent_name: str | None,
    user_id: str | None = None,
    tenant_id: str | None = None,
    state: MutableMapping[str, Any] | None = None,
) -> str:
    """The three-layer system prompt around ``system_prompt``, with the document kept in
    ``state``, loaded into it first if need be (without a state: loaded for this call only)."""
    state = {} if state is None else state
    load_agent_memory(state, agent_name=agent_name, user_id=user_id, tenant_id=tenant_id)
    return kept_agent_system_prompt(system_prompt, state)


def agent_prompt_baseline_tokens(
    system_prompt: str | None,
    *,
    agent_name: str | None,
    user_id: str | None = None,
    tenant_id: str | None = None,
    document: str | None = None,
) -> int:
    """Tokens of the system prompt the agent is sent, counted with the configured tokenizer
    (``token_counting``), so a gateway can budget the rest of the context.

    ``document`` is the text a conversation keeps (``state["agent_memory"]["content"]``); without
    it the stored document is loaded, as a new conversation would load it.
    """
    state: dict[str, Any] = {}
    if document is not None:
        state[STATE_KEY] = AgentMemory(content=document, version=0, path=MAIN_DOC_PATH)
    prompt = agent_system_prompt(
        system_prompt, agent_name=agent_name, user_id=user_id, tenant_id=tenant_id, state=state
    )
    return count_tokens(prompt, use_tiktoken=get_memory_config().token_counting == "tiktoken")
