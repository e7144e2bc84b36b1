"""Feedback signals in the user's recent turns: corrections and reinforcement (English and Chinese).

A correction tells the updater to store the right approach; reinforcement tells it to keep the
approach that worked. Only human turns among the last ``SIGNAL_WINDOW`` messages count.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from memstore.capture.message_access import message_text, message_type

SIGNAL_WINDOW = 6
"""How many of the most recent messages the signal detectors look at."""

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
