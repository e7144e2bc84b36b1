"""``LangChainMemoryMiddleware`` in a real ``create_agent`` loop.

The agent's model is langchain-core's fake chat model (recording what it is shown); the memory
LLM is the local OpenAI-compatible server reached through the real ``openai`` client; memory is
stored in a real SQLite file.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime
from pydantic import SecretStr

from memstore.config import SQL_STORAGE_CLASS, MemoryConfig, set_memory_config
from memstore.gateway.user_context import reset_current_user, set_current_user
from memstore.integrations.langchain import LangChainMemoryMiddleware
from memstore.queue import get_memory_queue, reset_memory_queue
from memstore.storage.loader import get_memory_storage, reset_memory_storage
from memstore.storage.sql.engine import dispose_engines
from tests.support.fake_chat import RecordingChatModel
from tests.support.openai_server import OpenAIStubServer
from tests.support.remember_llm import remember_reply


@pytest.fixture
def memory_config(tmp_path: Path, openai_server: OpenAIStubServer) -> Iterator[MemoryConfig]:
    config = MemoryConfig(
        data_dir=str(tmp_path / "data"),
        storage_class=SQL_STORAGE_CLASS,
        llm_base_url=openai_server.base_url,
        llm_api_key=SecretStr("test-key"),
        model_name="test-model",
        extractor="llm",
    )
    set_memory_config(config)
    reset_memory_storage()
    reset_memory_queue()
    openai_server.default_reply = remember_reply
    yield config
    reset_memory_queue()
    reset_memory_storage()
    dispose_engines()


def make_agent(
    replies: list[str], middleware: LangChainMemoryMiddleware | None = None
) -> tuple[CompiledStateGraph[Any, Any, Any, Any], RecordingChatModel]:
    model = RecordingChatModel(messages=iter(replies))
    agent = create_agent(model=model, tools=[], middleware=[middleware or LangChainMemoryMiddleware()])
    return agent, model


def ask(agent: CompiledStateGraph[Any, Any, Any, Any], text: str, *, thread: str, **kwargs: Any) -> Any:
    return agent.invoke(
        {"messages": [{"role": "user", "content": text}]},
        config={"configurable": {"thread_id": thread}},
        **kwargs,
    )


def fact_contents(user_id: str) -> list[str]:
    return [fact["content"] for fact in get_memory_storage().reload(user_id=user_id)["facts"]]


def test_second_conversation_sees_what_the_first_taught(
    memory_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    agent, model = make_agent(["Noted.", "Your editor is Helix.", "I do not know."])

    ask(agent, "Remember: Alice edits code in Helix.", thread="t-1", context={"user_id": "alice"})
    assert model.received[0][0].text == "Remember: Alice edits code in Helix."  # nothing known yet
    assert len(model.received[0]) == 1
    queue = get_memory_queue()
    assert queue.pending_count == 1
    queue.flush()
    assert "Remember: Alice edits code in Helix." in openai_server.prompts()[0]
    assert fact_contents("alice") == ["Alice edits code in Helix"]

    result = ask(agent, "Which editor do I use?", thread="t-2", context={"user_id": "alice"})
    memory_message, question = model.received[1]
    assert memory_message.text.startswith("<memory>") and memory_message.text.endswith("</memory>")
    assert "Alice edits code in Helix" in memory_message.text
    assert question.text == "Which editor do I use?"
    # The block was only lent to the model call: the thread's state holds the real conversation.
    assert [message.text for message in result["messages"]] == [
        "Which editor do I use?",
        "Your editor is Helix.",
    ]

    ask(agent, "Which editor do I use?", thread="t-3", context={"user_id": "bob"})
    assert "Helix" not in model.prompt_text(2)


def test_user_resolver_decides_the_scope_and_is_captured_at_enqueue_time(
    memory_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    @dataclass
    class Tenant:
        account: str

    def from_tenant(runtime: Runtime[Any]) -> str:
        return f"acct-{runtime.context.account}"

    agent, _ = make_agent(["Noted."], LangChainMemoryMiddleware(user_resolver=from_tenant))
    # A ContextVar user is bound while the run happens; the resolver must win, and the queue's
    # worker thread (which cannot see the ContextVar) must still save under the resolved user.
    token = set_current_user("someone-else")
    try:
        ask(agent, "Remember: the tenant bills in EUR.", thread="t-1", context=Tenant("42"))
    finally:
        reset_current_user(token)
    get_memory_queue().flush()
    assert fact_contents("acct-42") == ["the tenant bills in EUR"]
    assert fact_contents("someone-else") == []


def test_set_current_user_is_the_fallback_without_a_context(
    memory_config: MemoryConfig, openai_server: OpenAIStubServer
) -> None:
    agent, _ = make_agent(["Noted."])
    token = set_current_user("carol")
    try:
        ask(agent, "Remember: Carol is on call on Fridays.", thread="t-1")
    finally:
        reset_current_user(token)
    get_memory_queue().flush()
    assert fact_contents("carol") == ["Carol is on call on Fridays"]


def test_a_run_without_thread_id_is_not_queued(memory_config: MemoryConfig) -> None:
    agent, model = make_agent(["Noted."])
    agent.invoke(
        {"messages": [{"role": "user", "content": "Remember: nothing."}]}, context={"user_id": "dave"}
    )
    assert len(model.received) == 1
    assert get_memory_queue().pending_count == 0


def test_async_agent_injects_and_queues(memory_config: MemoryConfig, openai_server: OpenAIStubServer) -> None:
    agent, model = make_agent(["Noted.", "Tea."])

    async def conversation(text: str, thread: str) -> Any:
        return await agent.ainvoke(
            {"messages": [{"role": "user", "content": text}]},
            config={"configurable": {"thread_id": thread}},
            context={"user_id": "erin"},
        )

    asyncio.run(conversation("Remember: Erin drinks tea.", "t-1"))
    get_memory_queue().flush()
    result = asyncio.run(conversation("What do I drink?", "t-2"))
    assert "Erin drinks tea" in model.prompt_text(1)
    assert isinstance(result["messages"][-1], AIMessage)
    assert result["messages"][-1].text == "Tea."


def test_import_without_the_extra_names_it() -> None:
    code = "import sys; sys.modules['langchain'] = None; import memstore.integrations.langchain"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "pip install 'memstore[langchain]'" in result.stderr
