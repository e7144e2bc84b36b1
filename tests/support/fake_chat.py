"""langchain-core's fake chat model, recording the messages of every call so tests can read the prompt."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from pydantic import Field


class RecordingChatModel(GenericFakeChatModel):
    received: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.received.append(list(messages))
        return super()._generate(messages, stop, run_manager, **kwargs)

    def prompt_text(self, call: int = -1) -> str:
        """Every message text of one call, joined: what the model was shown."""
        return "\n".join(message.text for message in self.received[call])
