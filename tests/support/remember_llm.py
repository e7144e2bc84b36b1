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
