"""Compress a session that is due: summarise its raw turns, learn from the summary, replace them.

The durable queue runs this for a ``session_compress`` row (``thread_id`` holds the session id),
on the worker that holds the session's scope, so two compressions of one session never overlap.
The job reads the session when it runs: one whose raw turns are below the thresholds again (it
was compressed, cleared or expired meanwhile) is left alone, so each threshold crossing is
compressed once however many appends asked for it.

Order, for what a crash can cost: the summary is learned from (saved to long-term memory) before
the turns are replaced. A crash between the two runs the job again: the LLM summarises the same
turns again and the updater sees the same facts again (deduplicated), but no summary is ever
replaced without having been learned from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from memstore.capture.conversation import ConversationContext
from memstore.config import MemoryConfig
from memstore.errors import LLMError, LLMUnavailableError, MemoryUpdateParseError
from memstore.inject.tokens import count_tokens
from memstore.session import SessionKey, SessionTurn, compression_due
from memstore.storage.sessions.contract import SessionStore
from memstore.update.session_summary import ExtractiveSessionSummariser, SessionSummariser

logger = logging.getLogger(__name__)


def summary_conversation(context: ConversationContext, messages: list[dict[str, str]]) -> ConversationContext:
    """The summary as a conversation for the long-term updater, under the session's identity and
    capture time (an erase after it still wins)."""
    return ConversationContext(
        context.thread_id,
        messages,
        context.agent_name,
        context.user_id,
        timestamp=context.timestamp,
        tenant_id=context.tenant_id,
    )


class SessionCompressor:
    def __init__(
        self,
        store: SessionStore,
        summariser: SessionSummariser,
        learn: Callable[[ConversationContext], bool],
        config: MemoryConfig,
    ) -> None:
        self._store = store
        self._summariser = summariser
        self._learn = learn
        self._config = config

    def _summarise(self, previous: str | None, raw: list[SessionTurn]) -> tuple[SessionSummariser, str]:
        """The summariser's summary; after a failure that retrying will not fix (a refused or
        unreadable reply), the extractive one, logged, so a session the model will not summarise
        is still compressed instead of refusing appends until it expires. An endpoint that is
        down (``LLMUnavailableError``) is retried by the queue instead."""
        try:
            return self._summariser, self._summariser.summarise(previous, raw)
        except LLMUnavailableError:
            raise
        except (LLMError, MemoryUpdateParseError) as exc:
            if isinstance(self._summariser, ExtractiveSessionSummariser):
                raise
            logger.warning("session summary by the LLM failed; using the extractive summary: %s", exc)
            fallback = ExtractiveSessionSummariser(self._config)
            return fallback, fallback.summarise(previous, raw)

    def run(self, context: ConversationContext) -> bool:
        """``True`` when the session was compressed, ``False`` when it was not due (any more)."""
        config = self._config
        key = SessionKey(context.user_id, context.thread_id, context.agent_name, context.tenant_id)
        info, turns = self._store.read(key, now=datetime.now(UTC))
        if info is None or not compression_due(
            info, max_turns=config.session_max_turns, max_tokens=config.session_max_tokens
        ):
            return False
        raw = [turn for turn in turns if not turn.summary]
        if not raw:  # a token threshold met by the summary alone: nothing to replace
            return False
        previous = next((turn.content for turn in turns if turn.summary), None)
        summariser, text = self._summarise(previous, raw)
        if config.session_extract_long_term:
            self._learn(summary_conversation(context, summariser.as_conversation(text)))
        tokens = count_tokens(text, use_tiktoken=config.token_counting == "tiktoken")
        return self._store.compress(
            key,
            epoch=info.epoch,
            upto_seq=raw[-1].seq,
            summary=SessionTurn("system", text, tokens=tokens),
            now=datetime.now(UTC),
        )
