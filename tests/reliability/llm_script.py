"""Reading the update prompt and writing update replies, for scripted stub-LLM answers.

The stub server hands a reply function the request body; these helpers recover what the
updater sent (the current memory and the conversation, un-escaped) so a reply can name real
fact ids, the way a model would.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

_MEMORY = re.compile(r"<current_memory>\n(.*)\n</current_memory>", re.DOTALL)
_CONVERSATION = re.compile(r"<conversation>\n(.*)\n</conversation>", re.DOTALL)


def _unescape(value: Any) -> Any:
    if isinstance(value, str):
        return html.unescape(value)
    if isinstance(value, dict):
        return {_unescape(key): _unescape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unescape(item) for item in value]
    return value


def user_prompt(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


def prompt_memory(body: dict[str, Any]) -> dict[str, Any]:
    """The current-memory document the updater put in the prompt."""
    match = _MEMORY.search(user_prompt(body))
    assert match is not None, "no <current_memory> block in the prompt"
    document = _unescape(json.loads(match.group(1)))
    assert isinstance(document, dict)
    return document


def prompt_conversation(body: dict[str, Any]) -> str:
    match = _CONVERSATION.search(user_prompt(body))
    assert match is not None, "no <conversation> block in the prompt"
    return html.unescape(match.group(1))


def fact_id_for(memory: dict[str, Any], content: str) -> str | None:
    return next((str(f["id"]) for f in memory.get("facts", []) if f.get("content") == content), None)


def update_reply(
    new_facts: list[dict[str, Any]] | None = None,
    remove: list[str] | None = None,
    user: dict[str, Any] | None = None,
    history: dict[str, Any] | None = None,
) -> str:
    return json.dumps(
        {
            "user": user or {},
            "history": history or {},
            "newFacts": new_facts or [],
            "factsToRemove": remove or [],
        },
        ensure_ascii=False,
    )


def fact(content: str, confidence: float = 0.9, category: str = "context") -> dict[str, Any]:
    return {"content": content, "category": category, "confidence": confidence}


def turn(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]
