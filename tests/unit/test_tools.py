"""Tool mode: plain callables with JSON results, scoped to the caller's user and agent."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from memstore.config import MemoryConfig, set_memory_config
from memstore.errors import STORAGE_UNAVAILABLE_MESSAGE
from memstore.gateway.tools import (
    get_memory_tools,
    memory_add,
    memory_context,
    memory_delete,
    memory_search,
    memory_update,
)
from memstore.gateway.user_context import reset_current_user, set_current_user
from memstore.ops.facts import create_memory_fact, get_memory_data
from memstore.storage.loader import reset_memory_storage


def _json(raw: str) -> dict[str, Any]:
    value = json.loads(raw)
    assert isinstance(value, dict)
    return value


def test_get_memory_tools_returns_the_four_tools() -> None:
    tools = get_memory_tools()
    assert [tool.__name__ for tool in tools] == [
        "memory_search",
        "memory_add",
        "memory_update",
        "memory_delete",
    ]
    assert all(tool.__doc__ for tool in tools)


def test_add_stores_a_manual_fact_with_tool_default_confidence() -> None:
    result = _json(memory_add("  Prefers concise answers ", "preference", user_id="alice"))

    assert result["status"] == "added"
    [fact] = get_memory_data(user_id="alice")["facts"]
    assert fact["id"] == result["fact_id"]
    assert (fact["content"], fact["category"], fact["confidence"], fact["source"]) == (
        "Prefers concise answers",
        "preference",
        0.7,
        "manual",
    )


def test_add_uses_the_request_user_at_call_time() -> None:
    token = set_current_user("carol")
    try:
        added = _json(memory_add("Speaks Dutch"))
    finally:
        reset_current_user(token)

    assert [f["id"] for f in get_memory_data(user_id="carol")["facts"]] == [added["fact_id"]]
    assert get_memory_data(user_id="default")["facts"] == []


def test_add_rejects_a_duplicate_without_storing_it() -> None:
    memory_add("Uses Vim", user_id="alice")

    assert _json(memory_add("  USES VIM ", "knowledge", 0.9, user_id="alice")) == {"error": "Duplicate fact"}
    assert len(get_memory_data(user_id="alice")["facts"]) == 1


def test_add_rejects_a_duplicate_beyond_the_search_limit() -> None:
    for index in range(12):
        create_memory_fact(f"python fact {index}", confidence=0.9, user_id="alice")
    create_memory_fact("Python fact 99", confidence=0.1, user_id="alice")

    assert _json(memory_add("python FACT 99", user_id="alice")) == {"error": "Duplicate fact"}


def test_add_reports_invalid_arguments() -> None:
    assert _json(memory_add("   ", user_id="alice")) == {"error": "content: empty; a fact needs some text"}
    assert _json(memory_add("Fine", confidence=1.5, user_id="alice")) == {
        "error": "confidence: out of range; it must be a number from 0 to 1"
    }
    assert get_memory_data(user_id="alice")["facts"] == []


def test_add_reports_failure_when_max_facts_keeps_better_facts(isolated_config: MemoryConfig) -> None:
    set_memory_config(isolated_config.model_copy(update={"max_facts": 10}))
    for index in range(10):
        create_memory_fact(f"strong fact {index}", confidence=0.9, user_id="alice")

    result = _json(memory_add("weak fact", confidence=0.2, user_id="alice"))

    assert "error" in result and "fact_id" not in result
    contents = [fact["content"] for fact in get_memory_data(user_id="alice")["facts"]]
    assert len(contents) == 10 and "weak fact" not in contents


def test_search_returns_results_and_count() -> None:
    memory_add("Likes green tea", "preference", 0.6, user_id="alice")
    memory_add("Drinks tea every morning", "behavior", 0.9, user_id="alice")
    memory_add("Likes coffee", user_id="bob")

    result = _json(memory_search("TEA", user_id="alice"))

    assert result["count"] == 2
    # The full-text index ranks the shorter, closer match first, ahead of confidence.
    assert [fact["content"] for fact in result["results"]] == ["Likes green tea", "Drinks tea every morning"]
    assert _json(memory_search("tea", category="preference", user_id="alice"))["count"] == 1
    assert _json(memory_search("tea", limit=1, user_id="alice"))["count"] == 1
    assert _json(memory_search("tea", user_id="bob")) == {"results": [], "count": 0}


def test_search_keeps_non_ascii_readable() -> None:
    memory_add("喜欢喝茶", user_id="alice")

    raw = memory_search("茶", user_id="alice")

    assert "喜欢喝茶" in raw
    assert _json(raw)["count"] == 1


def test_tools_report_errors_as_json() -> None:
    assert "error" in _json(memory_search("tea", user_id="../escape"))
    assert "error" in _json(memory_add("x", user_id="../escape"))


def test_update_fact() -> None:
    fact_id = _json(memory_add("Uses Python 3.11", user_id="alice"))["fact_id"]

    result = _json(memory_update(fact_id, content="Uses Python 3.12", confidence=0.9, user_id="alice"))

    assert result == {"fact_id": fact_id, "status": "updated"}
    [fact] = get_memory_data(user_id="alice")["facts"]
    assert (fact["content"], fact["confidence"], fact["source"]) == ("Uses Python 3.12", 0.9, "manual")


def test_update_errors() -> None:
    first = _json(memory_add("First", user_id="alice"))["fact_id"]
    memory_add("Second", user_id="alice")

    assert _json(memory_update("fact_nothere", content="x", user_id="alice")) == {
        "error": "Fact not found: fact_nothere"
    }
    assert _json(memory_update(first, content="second", user_id="alice")) == {"error": "Duplicate fact"}
    assert _json(memory_update(first, confidence=-1, user_id="alice")) == {
        "error": "confidence: out of range; it must be a number from 0 to 1"
    }
    # Another user's tool call cannot see alice's fact.
    assert _json(memory_update(first, content="x", user_id="bob")) == {"error": f"Fact not found: {first}"}


def test_delete_fact() -> None:
    fact_id = _json(memory_add("Temporary", user_id="alice", agent_name="coder"))["fact_id"]

    assert _json(memory_delete(fact_id, user_id="alice")) == {"error": f"Fact not found: {fact_id}"}
    assert _json(memory_delete(fact_id, user_id="alice", agent_name="coder")) == {
        "fact_id": fact_id,
        "status": "deleted",
    }
    assert get_memory_data("coder", user_id="alice")["facts"] == []
    assert _json(memory_delete(fact_id, user_id="alice", agent_name="coder")) == {
        "error": f"Fact not found: {fact_id}"
    }


def test_tools_say_which_rule_refused_the_text_without_quoting_it() -> None:
    fact_id = _json(memory_add("Short fact", user_id="alice"))["fact_id"]
    marker = "ZQX-marker-7f3a "  # distinctive: an error that echoed the submitted text would show it
    too_long = (marker * 200)[:3000]

    assert _json(memory_add(too_long, user_id="alice")) == {
        "error": "content: 3,000 characters, the limit is 2,000"
    }
    assert _json(memory_add(marker + "\x00", user_id="alice")) == {
        "error": "content: contains NUL (U+0000), which cannot be stored"
    }
    assert _json(memory_add(marker + "\ud800", user_id="alice")) == {
        "error": "content: contains a lone surrogate (U+D800 to U+DFFF), which is not valid Unicode"
    }
    assert _json(memory_update(fact_id, content=too_long, user_id="alice")) == {
        "error": "content: 3,000 characters, the limit is 2,000"
    }
    assert _json(memory_add("Fine", too_long[:70], user_id="alice")) == {
        "error": "category: 70 characters, the limit is 64"
    }
    assert _json(memory_search(marker + "\x00", user_id="alice")) == {
        "error": "query: contains NUL (U+0000), which cannot be stored"
    }
    assert [fact["content"] for fact in get_memory_data(user_id="alice")["facts"]] == ["Short fact"]


def test_tools_report_argument_types_by_name_only() -> None:
    """An agent framework may pass what the schema did not ask for; the type is named, not the value."""
    assert _json(memory_add(["ZQX"], user_id="alice")) == {"error": "content: must be text, not list"}  # type: ignore[arg-type]
    assert _json(memory_add("Fine", 3, user_id="alice")) == {"error": "category: must be text, not int"}  # type: ignore[arg-type]
    assert _json(memory_add("Fine", confidence="ZQX", user_id="alice")) == {  # type: ignore[arg-type]
        "error": "confidence: must be a number from 0 to 1, not str"
    }
    assert get_memory_data(user_id="alice")["facts"] == []


def test_memory_add_refuses_an_unknown_category() -> None:
    assert _json(memory_add("Likes tea", "ZQX-not-a-category", user_id="alice")) == {
        "error": "category: unknown; use one of preference, knowledge, context, behavior, goal, correction"
    }
    assert _json(memory_search("tea", user_id="alice")) == {"results": [], "count": 0}


def test_memory_context_is_the_callers_block_and_says_why_it_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    memory_add("Alice drinks green tea", "preference", user_id="alice")
    memory_add("Bob drinks coffee", "preference", user_id="bob")

    block = _json(memory_context("what does she drink?", user_id="alice"))["context"]
    assert block.startswith("<memory>") and "green tea" in block and "coffee" not in block
    assert _json(memory_context("q" * 2001, user_id="alice")) == {
        "error": "query: 2,001 characters, the limit is 2,000"
    }
    # Asked for explicitly, the block does not depend on the settings for automatic injection.
    set_memory_config(MemoryConfig(data_dir=str(tmp_path / "data"), injection_enabled=False))
    assert "green tea" in _json(memory_context("tea", user_id="alice"))["context"]

    # An outage is an error the caller sees, not an empty block; its cause (a path, a database
    # host) stays in the server's log.
    (tmp_path / "not-a-dir").write_text("")
    set_memory_config(MemoryConfig(database_url=f"sqlite:///{tmp_path}/not-a-dir/memory.db"))
    reset_memory_storage()
    with caplog.at_level(logging.WARNING, logger="memstore.gateway.tools"):
        failed = _json(memory_context("tea", user_id="alice"))
    assert failed == {"error": STORAGE_UNAVAILABLE_MESSAGE}
    [record] = caplog.records
    assert record.getMessage().startswith("memory tool call of user alice failed, storage: cannot create")
