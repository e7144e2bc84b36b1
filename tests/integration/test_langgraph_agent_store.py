"""A LangChain v1 agent (a LangGraph graph) whose ``store=`` is memstore's, talking to a local
OpenAI-compatible server through ``ChatOpenAI``: its tools keep and recall the user's notes in the
store, and the notes are rows of ``memory_store_items`` under the user's identity, on SQLite and
PostgreSQL, through ``invoke`` (the store's ``batch``) and ``ainvoke`` (``abatch``, on the async
face).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime, tool
from langchain_openai import ChatOpenAI
from pydantic import SecretStr
from sqlalchemy import create_engine, select

from memstore import aio
from memstore.config import MemoryConfig, set_memory_config
from memstore.integrations.langgraph_store import MemstoreStore
from memstore.storage.loader import reset_memory_storage
from memstore.storage.sql.schema.models import store_items_table
from tests.support.openai_tool_stub import ToolCallingStub, call, running_tool_stub, say, tool_results


@tool
def remember(text: str, runtime: ToolRuntime[dict[str, str], Any]) -> str:
    """Keep a note about the user for later conversations."""
    assert runtime.store is not None
    user = runtime.context["user_id"]
    notes = runtime.store.search(("notes", user), limit=100)
    runtime.store.put(("notes", user), f"note-{len(notes) + 1}", {"text": text})
    return "kept"


@tool
def recall(query: str, runtime: ToolRuntime[dict[str, str], Any]) -> str:
    """Find the user's notes about a subject."""
    assert runtime.store is not None
    found = runtime.store.search(("notes", runtime.context["user_id"]), query=query, limit=5)
    return json.dumps([item.value["text"] for item in found])


@pytest.fixture
def database(sql_url: str) -> Iterator[str]:
    set_memory_config(MemoryConfig(database_url=sql_url))
    reset_memory_storage()
    yield sql_url
    reset_memory_storage()


@pytest.fixture
def stub() -> Iterator[ToolCallingStub]:
    with running_tool_stub() as server:
        yield server


def _agent(stub: ToolCallingStub) -> Any:
    model = ChatOpenAI(model="test-model", base_url=stub.base_url, api_key=SecretStr("k"), max_retries=0)
    return create_agent(model=model, tools=[remember, recall], store=MemstoreStore(namespace_user_index=1))


def _rows(url: str) -> list[tuple[str, str, str, str]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(
                    store_items_table.c.user_id,
                    store_items_table.c.namespace,
                    store_items_table.c.key,
                    store_items_table.c.value,
                ).order_by(store_items_table.c.user_id, store_items_table.c.key)
            )
            return [(row.user_id, row.namespace, row.key, str(row.value)) for row in rows]
    finally:
        engine.dispose()


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
def test_an_agents_store_keeps_its_notes_in_memstores_table(
    database: str, stub: ToolCallingStub, mode: str
) -> None:
    agent = _agent(stub)
    runner = asyncio.Runner()  # one loop for the test, as a server has: the model's client keeps it

    def ask(text: str, user: str) -> Any:
        message = {"messages": [{"role": "user", "content": text}]}
        if mode == "invoke":
            return agent.invoke(message, context={"user_id": user})
        return runner.run(agent.ainvoke(message, context={"user_id": user}))

    try:
        _conversations(ask, stub, database)
    finally:
        runner.run(aio.aclose())
        runner.close()


def _conversations(ask: Callable[[str, str], Any], stub: ToolCallingStub, database: str) -> None:
    stub.script(call("remember", text="Prefers green tea"), say("Noted."))
    ask("I like green tea", "alice")
    stub.script(call("remember", text="Plays the cello"), say("Noted."))
    ask("I play the cello", "bob")

    rows = _rows(database)
    assert [(user, namespace, key) for user, namespace, key, _ in rows] == [
        ("alice", "notes.alice", "note-1"),
        ("bob", "notes.bob", "note-1"),
    ]
    assert "Prefers green tea" in rows[0][3] and "cello" in rows[1][3]

    # A later conversation recalls through the store, and only the caller's own notes.
    stub.script(call("recall", query="tea"), lambda body: say(f"You said: {tool_results(body)[-1]}"))
    answer = ask("What do I drink?", "alice")
    assert json.loads(tool_results(stub.requests[-1])[-1]) == ["Prefers green tea"]
    assert "green tea" in answer["messages"][-1].content
    stub.script(call("recall", query="tea"), say("Nothing."))
    ask("What do I drink?", "bob")
    assert json.loads(tool_results(stub.requests[-1])[-1]) == ["Plays the cello"]
