"""The sync and the async face of memstore's API behind one interface, so one contract suite
runs on both (``face`` fixture: ``tests/integration/test_face_contract.py`` and the outage and
cancellation tests).

``SyncFace`` calls the functions as they are; ``AsyncFace`` awaits their ``memstore.aio`` (and
``MemoryMiddleware.a*``) namesakes on one event loop kept for the test (``asyncio.Runner``), and
closes that loop's pools at the end, as a server's shutdown does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

import memstore
from memstore import aio
from memstore.aio import queries as async_queries
from memstore.gateway.middleware import MemoryMiddleware
from memstore.inject.session_context import SessionContext
from memstore.ops import queries

T = TypeVar("T")


class Face(Protocol):
    name: str

    def call(self, function: str, *args: Any, **kwargs: Any) -> Any:
        """The fact or session helper ``function`` (its ``memstore`` name)."""

    def query(self, function: str, *args: Any, **kwargs: Any) -> Any:
        """The ``memstore.queries`` function ``function``."""

    def memory_context(self, middleware: MemoryMiddleware, **kwargs: Any) -> str: ...

    def read_memory_context(self, middleware: MemoryMiddleware, **kwargs: Any) -> str: ...

    def after_agent(self, middleware: MemoryMiddleware, messages: Iterable[Any], **kwargs: Any) -> None: ...

    def session_context(self, middleware: MemoryMiddleware, **kwargs: Any) -> SessionContext: ...

    def close(self) -> None: ...


class SyncFace:
    name = "sync"

    def call(self, function: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(memstore, function)(*args, **kwargs)

    def query(self, function: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(queries, function)(*args, **kwargs)

    def memory_context(self, middleware: MemoryMiddleware, **kwargs: Any) -> str:
        return middleware.memory_context(**kwargs)

    def read_memory_context(self, middleware: MemoryMiddleware, **kwargs: Any) -> str:
        return middleware.read_memory_context(**kwargs)

    def after_agent(self, middleware: MemoryMiddleware, messages: Iterable[Any], **kwargs: Any) -> None:
        middleware.after_agent(messages, **kwargs)

    def session_context(self, middleware: MemoryMiddleware, **kwargs: Any) -> SessionContext:
        return middleware.session_context(**kwargs)

    def close(self) -> None:
        """Nothing to close: the sync engines are the test's fixtures'."""


class AsyncFace:
    name = "async"

    def __init__(self) -> None:
        self._runner = asyncio.Runner()

    def run(self, awaitable: Callable[[], Awaitable[T]]) -> T:
        async def main() -> T:
            return await awaitable()

        return self._runner.run(main())

    def call(self, function: str, *args: Any, **kwargs: Any) -> Any:
        return self.run(lambda: getattr(aio, function)(*args, **kwargs))

    def query(self, function: str, *args: Any, **kwargs: Any) -> Any:
        return self.run(lambda: getattr(async_queries, function)(*args, **kwargs))

    def memory_context(self, middleware: MemoryMiddleware, **kwargs: Any) -> str:
        return self.run(lambda: middleware.amemory_context(**kwargs))

    def read_memory_context(self, middleware: MemoryMiddleware, **kwargs: Any) -> str:
        return self.run(lambda: middleware.aread_memory_context(**kwargs))

    def after_agent(self, middleware: MemoryMiddleware, messages: Iterable[Any], **kwargs: Any) -> None:
        self.run(lambda: middleware.aafter_agent(messages, **kwargs))

    def session_context(self, middleware: MemoryMiddleware, **kwargs: Any) -> SessionContext:
        return self.run(lambda: middleware.asession_context(**kwargs))

    def close(self) -> None:
        try:
            self._runner.run(aio.aclose())
        finally:
            self._runner.close()
