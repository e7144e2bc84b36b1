"""A store call with a deadline, for the agent documents' request path.

A database server that stops answering (frozen, a network partition) holds a pooled connection's
read with no error: no statement timeout fires on a server that is not running. The call runs on
a small worker pool instead and the caller stops waiting at the deadline, so a frozen database
costs one of those workers, never the agent's run or the event loop. The caller's context
variables (``set_current_user``) travel with the call.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from memstore.async_face import bounded_here, running_loop
from memstore.errors import StorageUnavailableError

T = TypeVar("T")

_executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="memstore-agent-doc")


class DeadlineExceededError(StorageUnavailableError):
    """The store did not answer within the deadline; the call may still complete later."""


def within(seconds: float, call: Callable[[], T], *, doing: str) -> T:
    """``call()``'s result, or ``DeadlineExceededError`` once ``seconds`` have passed. On the async
    face the call runs on the event loop instead of the pool (``memstore.async_face``)."""
    try:
        if running_loop() is not None:
            return bounded_here(seconds, call)
        future = _executor.submit(contextvars.copy_context().run, call)
        try:
            return future.result(timeout=seconds)
        except TimeoutError:
            future.cancel()
            raise
    except TimeoutError:
        raise DeadlineExceededError(
            f"the memory store did not answer within {seconds:g} s to {doing}"
        ) from None
