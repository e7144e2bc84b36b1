"""Choose which turns of a conversation feed long-term memory.

Memory is built from what the user said and the answers they saw. Tool chatter, system prompts
and framework-injected hidden messages (including the injected ``<memory>`` block itself) are
left out: feeding them back would let memory re-extract itself on every turn.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from memstore.capture.message_access import (
    message_additional_kwargs,
    message_text,
    message_tool_calls,
    message_type,
    with_content,
)

UPLOAD_BLOCK_RE = re.compile(r"<uploaded_files>[\s\S]*?</uploaded_files>\n*", re.IGNORECASE)


def _non_blank(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_human_input_response(payload: object) -> bool:
    """True for a well-formed v1 answer to a clarification request.

    Such answers arrive as hidden messages but are genuine user input, so they are the one kind
    of hidden message memory keeps. Anything malformed is treated as framework noise.
    """
    if not isinstance(payload, Mapping):
        return False
    version = payload.get("version")
    if isinstance(version, bool) or version != 1 or payload.get("kind") != "human_input_response":
        return False
    if not all(_non_blank(payload.get(key)) for key in ("source", "request_id", "value")):
        return False
    response_kind = payload.get("response_kind")
    return response_kind == "text" or (response_kind == "option" and _non_blank(payload.get("option_id")))


def _is_hidden(message: Any) -> bool:
    kwargs = message_additional_kwargs(message)
    return bool(kwargs.get("hide_from_ui")) and not _is_human_input_response(
        kwargs.get("human_input_response")
    )


def filter_messages_for_memory(messages: Iterable[Any]) -> list[Any]:
    """Keep human turns and final AI answers, minus file-upload plumbing.

    ``<uploaded_files>`` blocks are stripped (the files will not exist in a later session). A
    turn that was only an upload is dropped together with the AI reply that answers it. Kept
    messages are the originals, except stripped human turns, which are shallow copies.
    """
    kept: list[Any] = []
    skip_next_answer = False
    for message in messages:
        kind = message_type(message)
        if kind == "human":
            if _is_hidden(message):
                continue
            text = message_text(message)
            if UPLOAD_BLOCK_RE.search(text) is None:
                kept.append(message)
            else:
                remaining = UPLOAD_BLOCK_RE.sub("", text).strip()
                if not remaining:
                    skip_next_answer = True
                    continue
                kept.append(with_content(message, remaining))
            skip_next_answer = False
        elif kind == "ai" and not message_tool_calls(message):
            if skip_next_answer:
                skip_next_answer = False
            else:
                kept.append(message)
    return kept


def bound_conversation(messages: Sequence[Any], *, max_message_chars: int, max_total_chars: int) -> list[Any]:
    """The newest messages whose text fits ``max_total_chars``, each cut to ``max_message_chars``.

    A pasted log or a runaway thread must not cost unbounded memory or prompt tokens; the
    newest turns are what the memory update is about, so the oldest are dropped first. Messages
    that fit are the originals; cut ones are shallow copies.
    """
    kept: list[Any] = []
    total = 0
    for message in reversed(messages):
        text = message_text(message)
        if len(text) > max_message_chars:
            text = text[:max_message_chars]
            message = with_content(message, text)
        if kept and total + len(text) > max_total_chars:
            break
        kept.append(message)
        total += len(text)
    kept.reverse()
    return kept


def memory_turns(messages: Iterable[Any]) -> Iterator[tuple[str, str]]:
    """``(kind, text)`` of each human or AI turn with something to learn from, in order.

    Upload blocks are stripped from human turns (the files will not outlive the thread), text is
    stripped, and turns left empty are skipped. Both extractors read conversations through this.
    """
    for message in messages:
        kind = message_type(message)
        if kind not in ("human", "ai"):
            continue
        text = message_text(message)
        if kind == "human":
            text = UPLOAD_BLOCK_RE.sub("", text)
        text = text.strip()
        if text:
            yield kind, text
