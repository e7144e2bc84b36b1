"""A thin, synchronous chat-completions client for any OpenAI-compatible endpoint.

Only the sync ``client.chat.completions.create`` is used. Memory updates run on a worker
thread, and creating or borrowing an event loop there is how the reference ended up with
"Event loop is closed" errors in unrelated requests, so this module never touches asyncio.

``llm_timeout_seconds`` bounds the whole call, not one try. The ``openai`` client's own retries
are off (they multiplied the timeout: 5 s took 16.3 s); instead up to ``LLM_ATTEMPTS`` tries
share the one deadline, each waiting at most for the time left. Only answers that come back
quickly and may pass are tried again (a refused connection, 408, 409, 429, 5xx); a timeout
has used the time up. Each network wait is bounded, so the only way past the deadline is an
endpoint that keeps sending a reply byte by byte (httpx has no total deadline).
"""

from __future__ import annotations

import time
from typing import Any

from openai import APIConnectionError, APIStatusError, APITimeoutError, OpenAI, OpenAIError

from memstore.config import MemoryConfig
from memstore.errors import ConfigError, LLMError
from memstore.update.parser import extract_text

# Local servers (vLLM, Ollama, LM Studio) ignore the key, but the client insists on one.
PLACEHOLDER_API_KEY = "not-needed"
LLM_ATTEMPTS = 3
RETRY_PAUSE_SECONDS = 0.5
"""Pause before the second try; it doubles before each further one."""


def _worth_retrying(exc: OpenAIError) -> bool:
    if isinstance(exc, APITimeoutError):
        return False
    if isinstance(exc, APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return isinstance(exc, APIConnectionError)


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
                pause = RETRY_PAUSE_SECONDS * 2 ** (attempt - 1)
                # Try again only while the next try keeps at least as long as the pause before it.
                again = attempt < LLM_ATTEMPTS and time.monotonic() + 2 * pause < deadline
                if not (again and _worth_retrying(exc)):
                    raise LLMError(
                        f"chat completion with model {self.model!r} failed after {attempt} "
                        f"attempt(s) within {self.timeout_seconds:g} s: {exc}"
                    ) from exc
            time.sleep(pause)
            attempt += 1
        if not response.choices:
            raise LLMError(f"chat completion with model {self.model!r} returned no choices")
        return extract_text(response.choices[0].message.content)
