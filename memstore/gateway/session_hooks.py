"""Session memory on a gateway's request path: record the turn, read the session back.

``MemoryMiddleware(session_memory=True)`` records each run's exchange (the latest user message
and the final answers after it) in the session named by the thread id, and
``MemoryMiddleware.session_context`` returns the session's summary and recent turns for the
next prompt. Like the long-term hooks, neither may break or stall the request: each runs on the
middleware's read pool, gives up after ``memory_context_timeout_seconds`` and logs a failure
instead of raising it, except a setup error that no retry fixes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import Any, TypeVar

from memstore.async_face import bounded_on_loop
from memstore.capture.filtering import filter_messages_for_memory, memory_turns
from memstore.config import MemoryConfig
from memstore.errors import SETUP_ERRORS, SessionLimitError, StorageUnavailableError
from memstore.inject.session_context import SessionContext
from memstore.ops import sessions
from memstore.session import SessionTurn

T = TypeVar("T")
logger = logging.getLogger(__name__)
EMPTY_CONTEXT = SessionContext([], None, [], 0, 0)
_ROLES = {"human": "user", "ai": "assistant"}


def latest_exchange(messages: Iterable[Any]) -> list[dict[str, str]]:
    """The last user message and the answers after it, as session turns (upload blocks, hidden
    messages and tool traffic left out, as for long-term memory)."""
    turns = [
        {"role": _ROLES[kind], "content": text}
        for kind, text in memory_turns(filter_messages_for_memory(messages))
    ]
    last_user = max((index for index, turn in enumerate(turns) if turn["role"] == "user"), default=None)
    return [] if last_user is None else turns[last_user:]


def bounded(executor: Executor, config: MemoryConfig, call: Callable[[], T], *, doing: str, fallback: T) -> T:
    """``call()`` on ``executor`` within ``memory_context_timeout_seconds``; ``fallback`` (logged)
    on a timeout or failure, a setup error raised."""
    timeout = config.memory_context_timeout_seconds
    future = executor.submit(call)
    with _logged(timeout, doing):
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            future.cancel()
            raise
    return fallback


async def abounded(config: MemoryConfig, call: Callable[[], T], *, doing: str, fallback: T) -> T:
    """``bounded`` on the async face: ``call()`` on the event loop (``memstore.async_face``)."""
    timeout = config.memory_context_timeout_seconds
    with _logged(timeout, doing):
        return await bounded_on_loop(timeout, call)
    return fallback


@contextmanager
def _logged(timeout: float, doing: str) -> Iterator[None]:
    """Log and swallow what a session call may fail with; a setup error is raised."""
    try:
        yield
    except SETUP_ERRORS:
        raise
    except TimeoutError:
        logger.warning("session store took longer than %.1f s to %s; continuing without it", timeout, doing)
    except (StorageUnavailableError, SessionLimitError) as exc:
        logger.warning("could not %s: %s", doing, exc)
    except Exception as exc:
        logger.error("could not %s: %s", doing, type(exc).__name__)


def record_exchange(
    messages: Sequence[Any],
    *,
    config: MemoryConfig,
    session_id: str,
    user_id: str | None,
    agent_name: str | None,
    tenant_id: str,
) -> None:
    """Append the latest exchange, each message cut to ``session_max_turn_chars`` (a gateway's
    long answer is bounded here rather than refused whole)."""
    limit = config.session_max_turn_chars
    exchange = [{**turn, "content": turn["content"][:limit]} for turn in latest_exchange(messages)]
    if not exchange:
        return
    _, stored = sessions.read_session(user_id, session_id, agent_name=agent_name, tenant_id=tenant_id)
    new = exchange[recorded_prefix(stored, exchange) :]
    if new:
        sessions.append_turns(user_id, session_id, new, agent_name=agent_name, tenant_id=tenant_id)


def recorded_prefix(stored: Sequence[SessionTurn], exchange: Sequence[dict[str, str]]) -> int:
    """How many of ``exchange``'s first turns the session already ends with: a run that added no
    user message (a reminder, a retry) hands ``after_agent`` an exchange recorded before."""
    tail = [(turn.role, turn.content) for turn in stored if not turn.summary]
    wanted = [(turn["role"], turn["content"]) for turn in exchange]
    for size in range(min(len(tail), len(wanted)), 0, -1):
        if tail[-size:] == wanted[:size]:
            return size
    return 0
