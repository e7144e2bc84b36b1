"""Save what a summarizer is about to drop: the flush hook for conversation compaction.

Once old messages are summarized away, the after-agent middleware never sees them again, so
they are queued for an immediate update (``add_nowait``) instead of waiting for the debounce.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from memstore.capture.conversation import capture_conversation
from memstore.config import get_memory_config
from memstore.gateway.user_context import effective_roles, effective_tenant, get_effective_user_id
from memstore.queue import get_memory_queue, queue_failure
from memstore.scope import validate_tenant_id

logger = logging.getLogger(__name__)


def memory_flush_hook(
    messages: Iterable[Any],
    *,
    thread_id: str | None,
    user_id: str | None = None,
    agent_name: str | None = None,
    tenant_id: str | None = None,
    roles: Iterable[str] | None = None,
) -> None:
    """Queue ``messages`` (those being summarized) for memory and process the queue now.

    The user and tenant default to the request's, read here because the worker cannot see them.
    ``roles`` are checked but not queued: the update writes private facts only. Never raises: a
    memory failure must not break summarization.
    """
    if not get_memory_config().enabled or not thread_id:
        return
    try:
        effective_roles(roles)
        context = capture_conversation(
            messages,
            thread_id=thread_id,
            user_id=user_id or get_effective_user_id(),
            agent_name=agent_name,
            tenant_id=validate_tenant_id(effective_tenant(tenant_id)),
        )
        if context is not None:
            get_memory_queue().submit(context, immediately=True)
    except Exception as exc:
        logger.error("could not queue the pre-summarization memory flush: %s", queue_failure(exc))
