"""A thin, synchronous chat-completions client for any OpenAI-compatible endpoint.

Only the sync ``client.chat.completions.create`` is used. Memory updates run on a worker
thread, and creating or borrowing an event loop there is how the reference ended up with
"Event loop is closed" errors in unrelated requests, so this module never touches asyncio.

``llm_timeout_seconds`` bounds the whole call, not one try. The ``openai`` client's own retries
are off (they multiplied the timeout: 5 s took 16.3 s); instead up to ``LLM_ATTEMPTS`` tries
share the one deadline, each waiting at most for the time left. Only answers that come back
quickly and may pass are tried again (a refused connection, 408, 409, 429, 5xx), waiting at
least the endpoint's ``Retry-After``; a timeout has used the time up. What still fails but may
pass later raises ``LLMUnavailableError`` (the durable queue retries it), the rest ``LLMError``.
Each network wait is bounded, so the only way past the deadline is an
endpoint that keeps sending a reply byte by byte (httpx has no total deadline).
"""

from __future__ import annotations

import time
from typing import Any

from openai import APIConnectionError, APIStatusError, APITimeoutError, OpenAI, OpenAIError

from memstore.config import MemoryConfig
from memstore.errors import ConfigError, LLMError, LLMUnavailableError
from memstore.metrics import LLM_CALLS, LLM_SECONDS
from memstore.update.parser import extract_text

# Local servers (vLLM, Ollama, LM Studio) ignore the key, but the client insists on one.
PLACEHOLDER_API_KEY = "not-needed"
LLM_ATTEMPTS = 3
RETRY_PAUSE_SECONDS = 0.5
"""Pause before the second try; it doubles before each further one."""


MAX_RETRY_AFTER_SECONDS = 3600.0
"""A ``Retry-After`` beyond this is taken as this: a typo must not park the queue for a day."""


def _transient(exc: OpenAIError) -> bool:
    """Failures that may pass if tried later: the queue retries them instead of giving up."""
    if isinstance(exc, APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return isinstance(exc, APIConnectionError)  # APITimeoutError included


def _worth_retrying_now(exc: OpenAIError) -> bool:
    # A timeout has used the call's time up; anything else transient may pass on the next try.
    return _transient(exc) and not isinstance(exc, APITimeoutError)


def retry_after_seconds(exc: OpenAIError) -> float | None:
    """The endpoint's ``Retry-After`` (seconds form), when it sent one."""
    if not isinstance(exc, APIStatusError):
        return None
    raw = exc.response.headers.get("retry-after")
    try:
        seconds = float(raw) if raw is not None else None
    except ValueError:
        return None
    if seconds is None or not seconds >= 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


class LLMClient:
    """One ``OpenAI`` client per config; it is thread-safe and reuses its connection pool."""

    def __init__(self, config: MemoryConfig, *, model_name: str | None = None) -> None:
        model = model_name or config.model_name
        if not model:
            raise ConfigError(
                "model_name is not set: configure memory.model_name (or MEMSTORE_MODEL_NAME) "
                "to use the LLM extractor"
            )
        self.model = model
        self.json_mode = config.llm_json_mode
        self.timeout_seconds = config.llm_timeout_seconds
        api_key = config.llm_api_key.get_secret_value() if config.llm_api_key else PLACEHOLDER_API_KEY
        self._client = OpenAI(
            base_url=config.llm_base_url, api_key=api_key, timeout=self.timeout_seconds, max_retries=0
        )

    def complete(self, messages: list[dict[str, str]]) -> str:
        """The assistant's reply as text; structured or empty content is flattened."""
        started = time.monotonic()
        outcome = "error"
        try:
            reply = self._complete(messages)
            outcome = "ok"
            return reply
        finally:
            LLM_SECONDS.observe(time.monotonic() - started)
            LLM_CALLS.labels(outcome).inc()

    def _complete(self, messages: list[dict[str, str]]) -> str:
        options: dict[str, Any] = {}
        if self.json_mode:
            options["response_format"] = {"type": "json_object"}
        deadline = time.monotonic() + self.timeout_seconds
        attempt = 1
        while True:
            try:
                response = self._client.chat.completions.create(
                    model=self.model,
                    messages=messages,  # type: ignore[arg-type]
                    timeout=max(deadline - time.monotonic(), 0.0),
                    **options,
                )
                break
            except OpenAIError as exc:
                retry_after = retry_after_seconds(exc)
                pause = max(RETRY_PAUSE_SECONDS * 2 ** (attempt - 1), retry_after or 0.0)
                # Try again only while the next try keeps at least as long as the pause before it.
                again = attempt < LLM_ATTEMPTS and time.monotonic() + 2 * pause < deadline
                if not (again and _worth_retrying_now(exc)):
                    message = (
                        f"chat completion with model {self.model!r} failed after {attempt} "
                        f"attempt(s) within {self.timeout_seconds:g} s: {exc}"
                    )
                    if _transient(exc):
                        raise LLMUnavailableError(message, retry_after=retry_after) from exc
                    raise LLMError(message) from exc
            time.sleep(pause)
            attempt += 1
        if not response.choices:
            raise LLMError(f"chat completion with model {self.model!r} returned no choices")
        return extract_text(response.choices[0].message.content)
