"""Uniform read access to chat messages in either LangChain or OpenAI shape.

LangChain messages expose ``.type`` (``human``/``ai``/``tool``/``system``), ``.content``,
``.tool_calls`` and ``.additional_kwargs``; OpenAI-style dicts carry ``role``
(``user``/``assistant``/``tool``/``system``), ``content`` and ``tool_calls``. Everything
downstream speaks the LangChain vocabulary.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

_ROLE_TO_TYPE = {"user": "human", "assistant": "ai", "human": "human", "ai": "ai"}


def message_type(message: Any) -> str:
    """``human``, ``ai``, ``tool``, ``system`` or whatever else the message calls itself."""
    if isinstance(message, Mapping):
        raw = message.get("role", message.get("type", "unknown"))
    else:
        raw = getattr(message, "type", "unknown")
    return _ROLE_TO_TYPE.get(str(raw), str(raw))


def message_content(message: Any) -> Any:
    if isinstance(message, Mapping):
        return message.get("content", "")
    return getattr(message, "content", "")


def message_tool_calls(message: Any) -> Any:
    if isinstance(message, Mapping):
        return message.get("tool_calls")
    return getattr(message, "tool_calls", None)


def message_additional_kwargs(message: Any) -> Mapping[str, Any]:
    raw = (
        message.get("additional_kwargs")
        if isinstance(message, Mapping)
        else getattr(message, "additional_kwargs", None)
    )
    return raw if isinstance(raw, Mapping) else {}


def content_text(content: Any) -> str:
    """Flatten structured content: text parts joined by a space; anything else via ``str``."""
    if isinstance(content, list):
        parts = [
            part if isinstance(part, str) else part["text"]
            for part in content
            if isinstance(part, str) or (isinstance(part, Mapping) and isinstance(part.get("text"), str))
        ]
        return " ".join(parts)
    if content is None:
        return ""
    return str(content)


def message_text(message: Any) -> str:
    return content_text(message_content(message))


def with_content(message: Any, content: str) -> Any:
    """A shallow copy of ``message`` carrying new text content, in the message's own shape."""
    if isinstance(message, Mapping):
        copied = dict(message)
        copied["content"] = content
        return copied
    model_copy = getattr(message, "model_copy", None)
    if callable(model_copy):
        return model_copy(update={"content": content})
    clone = copy.copy(message)
    clone.content = content
    return clone


_TYPE_TO_ROLE = {"human": "user", "ai": "assistant"}


def text_only(message: Any) -> dict[str, str]:
    """``message`` as a plain ``{"role", "content"}`` dict holding only its text.

    What a queued conversation keeps: after filtering, memory reads nothing but the type and the
    text, and an image or a payload riding along in the original would escape every text bound.
    """
    kind = message_type(message)
    return {"role": _TYPE_TO_ROLE.get(kind, kind), "content": message_text(message)}
