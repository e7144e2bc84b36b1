"""The ``Extractor`` seam: a conversation plus the current memory in, a normalised update out.

Two implementations: ``LLMExtractor`` builds the prompt, calls the endpoint and parses the reply;
``RulesExtractor`` reads explicit statements offline and builds the update directly. Which one
runs is decided by ``resolve_extractor`` from the configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol

from memstore.capture.conversation import ConversationContext
from memstore.capture.filtering import memory_turns
from memstore.config import MemoryConfig
from memstore.document import DOCUMENT_KEYS, MemoryDocument
from memstore.errors import ConfigError
from memstore.update.parser import MemoryUpdate, parse_update_response
from memstore.update.prompt import build_update_prompt
from memstore.update.rules import extract_update

if TYPE_CHECKING:
    from memstore.update.llm import LLMClient

ExtractorName = Literal["llm", "rules"]


class Extractor(Protocol):
    def extract(self, context: ConversationContext, current: MemoryDocument) -> MemoryUpdate | None:
        """The update ``context`` calls for, or ``None`` when its conversation holds nothing to learn."""
        ...


class LLMExtractor:
    def __init__(self, client: LLMClient, config: MemoryConfig) -> None:
        self._client = client
        self._config = config

    @property
    def client(self) -> LLMClient:
        """The endpoint's client, which near-duplicate adjudication asks too."""
        return self._client

    def extract(self, context: ConversationContext, current: MemoryDocument) -> MemoryUpdate | None:
        # Only the document itself goes to the endpoint: a provider's bookkeeping (the SQL
        # provider's revision and scope-row incarnation) means nothing to the model.
        document = {key: current[key] for key in DOCUMENT_KEYS if key in current}
        prompt = build_update_prompt(
            document,
            context.messages,
            correction_detected=context.correction_detected,
            reinforcement_detected=context.reinforcement_detected,
            config=self._config,
        )
        if prompt is None:
            return None
        return parse_update_response(self._client.complete(prompt))


class RulesExtractor:
    def extract(self, context: ConversationContext, current: MemoryDocument) -> MemoryUpdate | None:
        if next(memory_turns(context.messages), None) is None:
            return None
        return extract_update(context.messages, current, correction_detected=context.correction_detected)


def resolve_extractor(config: MemoryConfig) -> ExtractorName:
    """Which extractor ``config`` selects; ``auto`` means the LLM whenever an endpoint or key is set."""
    has_endpoint = bool(config.llm_base_url) or config.llm_api_key is not None
    if config.extractor == "rules":
        return "rules"
    if config.extractor == "llm":
        if not has_endpoint:
            raise ConfigError("extractor is 'llm' but neither llm_base_url nor llm_api_key is configured")
        return "llm"
    return "llm" if has_endpoint else "rules"


def build_extractor(config: MemoryConfig, *, model_name: str | None = None) -> Extractor:
    """The extractor ``config`` selects; ``model_name`` overrides ``config.model_name`` for the LLM."""
    if resolve_extractor(config) == "rules":
        return RulesExtractor()
    # Imported here: the openai client is half a second of imports that a CLI command, or a
    # gateway on the rules extractor, would otherwise pay at startup for nothing.
    from memstore.update.llm import LLMClient

    return LLMExtractor(LLMClient(config, model_name=model_name), config)


def describe_extractor(config: MemoryConfig) -> str:
    """A one-line, secret-free description of the extractor ``config`` selects."""
    if resolve_extractor(config) == "rules":
        return "rule-based (offline, explicit statements only; lower recall than an LLM)"
    endpoint = config.llm_base_url or "the OpenAI API"
    return f"LLM {config.model_name or '(model_name not set)'} at {endpoint}"
