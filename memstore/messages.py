"""Choose which turns of a conversation feed long-term memory, and spot feedback signals in them.

Memory is built from what the user said and the answers they saw. Tool chatter, system prompts
and framework-injected hidden messages (including the injected ``<memory>`` block itself) are
left out: feeding them back would let memory re-extract itself on every turn.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memstore.message_access import (
    message_additional_kwargs,
    message_text,
    message_tool_calls,
    message_type,
    with_content,
)

SIGNAL_WINDOW = 6
"""How many of the most recent messages the signal detectors look at."""

UPLOAD_BLOCK_RE = re.compile(r"<uploaded_files>[\s\S]*?</uploaded_files>\n*", re.IGNORECASE)

# Each list is one behaviour contract (English and Chinese); they are OR-ed into one regex so a
# scan is a single pass. IGNORECASE only affects the Latin patterns.
_CORRECTION_PATTERNS = (
    r"\bthat(?:'s| is) (?:wrong|incorrect)\b",
    r"\byou misunderstood\b",
    r"\btry again\b",
    r"\bredo\b",
    r"不对",
    r"你理解错了",
    r"你理解有误",
    r"重试",
    r"重新来",
    r"换一种",
    r"改用",
)
_REINFORCEMENT_PATTERNS = (
    r"\byes[,.]?\s+(?:exactly|perfect|that(?:'s| is) (?:right|correct|it))\b",
    r"\bperfect(?:[.!?]|$)",
    r"\bexactly\s+(?:right|correct)\b",
    r"\bthat(?:'s| is)\s+(?:exactly\s+)?(?:right|correct|what i (?:wanted|needed|meant))\b",
    r"\bkeep\s+(?:doing\s+)?that\b",
    r"\bjust\s+(?:like\s+)?(?:that|this)\b",
    r"\bthis is (?:great|helpful)\b(?:[.!?]|$)",
    r"\bthis is what i wanted\b(?:[.!?]|$)",
    r"对[，,]?\s*就是这样(?:[。！？!?.]|$)",
    r"完全正确(?:[。！？!?.]|$)",
    r"(?:对[，,]?\s*)?就是这个意思(?:[。！？!?.]|$)",
    r"正是我想要的(?:[。！？!?.]|$)",
    r"继续保持(?:[。！？!?.]|$)",
)


def _any_of(patterns: Sequence[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{pattern})" for pattern in patterns), re.IGNORECASE)


_CORRECTION = _any_of(_CORRECTION_PATTERNS)
_REINFORCEMENT = _any_of(_REINFORCEMENT_PATTERNS)


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


def _recent_human_texts(messages: Sequence[Any]) -> list[str]:
    texts = (message_text(m).strip() for m in messages[-SIGNAL_WINDOW:] if message_type(m) == "human")
    return [text for text in texts if text]


def detect_correction(messages: Sequence[Any]) -> bool:
    """Did the user recently tell the assistant it got something wrong?"""
    return any(_CORRECTION.search(text) for text in _recent_human_texts(messages))


def detect_reinforcement(messages: Sequence[Any]) -> bool:
    """Did the user recently confirm the assistant's approach was right?

    Callers should give a correction precedence: ``not correction and detect_reinforcement(...)``.
    """
    return any(_REINFORCEMENT.search(text) for text in _recent_human_texts(messages))


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
