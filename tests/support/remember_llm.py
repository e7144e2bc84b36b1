"""Scripted memory LLMs for the local OpenAI-compatible server: they "learn" from the conversation shown."""

from __future__ import annotations

import json
import re
from typing import Any

REMEMBER = re.compile(r"Remember: ([^.<&]+)\.")


def remember_reply(body: dict[str, Any]) -> str:
    """An update whose new facts are the ``Remember:`` sentences inside the prompt's ``<conversation>``."""
    prompt = "\n".join(str(message.get("content", "")) for message in body["messages"])
    conversation = prompt.split("<conversation>", 1)[-1]
    facts = [
        {"content": text.strip(), "category": "context", "confidence": 0.9}
        for text in REMEMBER.findall(conversation)
    ]
    return json.dumps({"user": {}, "history": {}, "newFacts": facts, "factsToRemove": []})


def statements_reply(body: dict[str, Any]) -> str:
    """An update that keeps every statement (a ``User:`` line ending in ``.``) as a fact, verbatim."""
    prompt = "\n".join(str(message.get("content", "")) for message in body["messages"])
    conversation = prompt.split("<conversation>", 1)[-1].split("</conversation>", 1)[0]
    facts = [
        {
            "content": line.removeprefix("User: ").strip().removesuffix("."),
            "category": "context",
            "confidence": 0.9,
        }
        for line in conversation.splitlines()
        if line.startswith("User: ") and line.strip().endswith(".")
    ]
    return json.dumps({"user": {}, "history": {}, "newFacts": facts, "factsToRemove": []})
