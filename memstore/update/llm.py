"""A thin, synchronous chat-completions client for any OpenAI-compatible endpoint.

Only the sync ``client.chat.completions.create`` is used. Memory updates run on a worker
thread, and creating or borrowing an event loop there is how the reference ended up with
"Event loop is closed" errors in unrelated requests, so this module never touches asyncio.
"""

from __future__ import annotations

from typing import Any

from openai import OpenAI, OpenAIError

from memstore.config import MemoryConfig
from memstore.errors import ConfigError, LLMError
from memstore.update.parser import extract_text

# Local servers (vLLM, Ollama, LM Studio) ignore the key, but the client insists on one.
PLACEHOLDER_API_KEY = "not-needed"


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
        api_key = config.llm_api_key.get_secret_value() if config.llm_api_key else PLACEHOLDER_API_KEY
        self._client = OpenAI(
            base_url=config.llm_base_url, api_key=api_key, timeout=config.llm_timeout_seconds
        )

    def complete(self, messages: list[dict[str, str]]) -> str:
        """The assistant's reply as text; structured or empty content is flattened."""
        options: dict[str, Any] = {}
        if self.json_mode:
            options["response_format"] = {"type": "json_object"}
        try:
            response = self._client.chat.completions.create(
                model=self.model,
                messages=messages,  # type: ignore[arg-type]
                **options,
            )
        except OpenAIError as exc:
            raise LLMError(f"chat completion with model {self.model!r} failed: {exc}") from exc
        if not response.choices:
            raise LLMError(f"chat completion with model {self.model!r} returned no choices")
        return extract_text(response.choices[0].message.content)
