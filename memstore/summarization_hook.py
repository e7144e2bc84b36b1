"""Save what a summarizer is about to drop: the flush hook for conversation compaction.

Once old messages are summarized away, the after-agent middleware never sees them again, so
they are queued for an immediate update (``add_nowait``) instead of waiting for the debounce.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from memstore.config import get_memory_config
from memstore.middleware import capture_conversation
from memstore.queue import get_memory_queue
from memstore.user_context import get_effective_user_id

logger = logging.getLogger(__name__)


def memory_flush_hook(
    messages: Iterable[Any],
    *,
    thread_id: str | None,
    user_id: str | None = None,
    agent_name: str | None = None,
) -> None:
    """Queue ``messages`` (those being summarized) for memory and process the queue now.

    The user defaults to the request's user, read here because the worker cannot see it.
    Never raises: a memory failure must not break summarization.
    """
    if not get_memory_config().enabled or not thread_id:
        return
    try:
        turn = capture_conversation(messages)
        if turn is None:
            return
        get_memory_queue().add_nowait(
            thread_id=thread_id,
            messages=turn.messages,
            agent_name=agent_name,
            user_id=user_id or get_effective_user_id(),
            correction_detected=turn.correction_detected,
            reinforcement_detected=turn.reinforcement_detected,
        )
    except Exception:
        logger.exception("could not queue the pre-summarization memory flush for thread %s", thread_id)
