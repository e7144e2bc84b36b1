"""Choose which turns of a conversation feed long-term memory.

Memory is built from what the user said and the answers they saw. Tool chatter, system prompts
and framework-injected hidden messages (including the injected ``<memory>`` block itself) are
left out: feeding them back would let memory re-extract itself on every turn.

Everything here runs on the request path over text users paste, so it is linear in the input
and bounded: only the newest ``MAX_SCANNED_CONVERSATION_CHARS`` of a thread, and the first
``MAX_SCANNED_MESSAGE_CHARS`` of a message, are read. Both are generous multiples of what the
queue keeps (8,000 characters a message, 64,000 a conversation), so they only cut what would be
cut later anyway, unless upload blocks alone fill the difference.
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

MAX_SCANNED_MESSAGE_CHARS = 64_000
MAX_SCANNED_CONVERSATION_CHARS = 256_000

_UPLOAD_OPEN = re.compile(r"<uploaded_files>", re.IGNORECASE)
_UPLOAD_CLOSE = re.compile(r"</uploaded_files>\n*", re.IGNORECASE)
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")


def strip_upload_blocks(text: str) -> str:
    """``text`` without ``<uploaded_files>...</uploaded_files>`` blocks and the newlines after them.

    The same result as the reference's ``re.sub(r"<uploaded_files>[\\s\\S]*?</uploaded_files>\\n*",
    "", text, flags=IGNORECASE)``, in one pass: that pattern rescans to the end of the text from
    every unclosed tag, so a message of repeated open tags cost quadratic time (28 s at 320 KB).
    An open tag without a close after it ends the scan, because no later tag can have one either.
    Text without a complete block is returned as it is.
    """
    pieces: list[str] = []
    position = 0
    while (opening := _UPLOAD_OPEN.search(text, position)) is not None:
        closing = _UPLOAD_CLOSE.search(text, opening.end())
        if closing is None:
            break
        pieces.append(text[position : opening.start()])
        position = closing.end()
    if not pieces:
        return text
    pieces.append(text[position:])
    return "".join(pieces)


def storable_text(text: str) -> str:
    """``text`` with NUL and each lone surrogate replaced by U+FFFD, so any store can keep it.

    PostgreSQL refuses NUL in text and JSON, and no UTF-8 encoder takes a lone surrogate. One
    such character (a bad client, a cut emoji, a hostile user) must cost neither the
    conversation's update nor, by failing a shared write, anybody else's.
    """
    return _UNSTORABLE.sub("\ufffd", text)


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
    messages are the originals, except stripped or cut human turns, which are shallow copies.
    Only the window described in the module docstring is read.
    """
    window = bound_conversation(
        list(messages),
        max_message_chars=MAX_SCANNED_MESSAGE_CHARS,
        max_total_chars=MAX_SCANNED_CONVERSATION_CHARS,
    )
    kept: list[Any] = []
    skip_next_answer = False
    for message in window:
        kind = message_type(message)
        if kind == "human":
            if _is_hidden(message):
                continue
            text = message_text(message)
            remaining = strip_upload_blocks(text)
            if remaining == text:
                kept.append(message)
            else:
                remaining = remaining.strip()
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
    stripped, and turns left empty are skipped. Both extractors read conversations through this,
    so it is also where a turn is made safe to send and store: only its first
    ``MAX_SCANNED_MESSAGE_CHARS`` are read, and NUL and lone surrogates become U+FFFD.
    """
    for message in messages:
        kind = message_type(message)
        if kind not in ("human", "ai"):
            continue
        text = storable_text(message_text(message)[:MAX_SCANNED_MESSAGE_CHARS])
        if kind == "human":
            text = strip_upload_blocks(text)
        text = text.strip()
        if text:
            yield kind, text


def latest_user_text(messages: Sequence[Any]) -> str | None:
    """The newest visible human message's text, upload blocks removed: the query that
    query-aware injection ranks facts against (``None`` when there is none)."""
    for message in reversed(messages):
        if message_type(message) != "human" or _is_hidden(message):
            continue
        text = strip_upload_blocks(message_text(message)).strip()
        if text:
            return text
    return None
