"""The async face: memstore's one synchronous core, run on the event loop with async drivers.

The core (storage, ranking, queue writes, sessions) is written once, against SQLAlchemy's
synchronous ``Connection``. ``run_on_loop`` runs a core call inside a greenlet (SQLAlchemy's
``greenlet_spawn``, the mechanism behind ``AsyncConnection.run_sync``). While it runs,
``memstore.storage.sql.engine.engine_for`` hands the core an engine on an async driver (aiosqlite,
psycopg's async connection) bound to this loop, so every database call suspends the greenlet and
awaits the driver: the loop serves other requests meanwhile and no thread is held. Other I/O the
core does on the request path (the embeddings and rerank endpoints) awaits the async HTTP client
through ``await_on_loop``; a threading lock the core would hold across I/O is taken with ``held``,
which yields to the loop instead of blocking it.

Validation, errors, caps, identity, row-level security settings and caches are the sync path's by
construction: it is the same code.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial, wraps
from typing import Any, ParamSpec, TypeVar, cast

from sqlalchemy.util import await_only, greenlet_spawn
from sqlalchemy.util.concurrency import in_greenlet

P = ParamSpec("P")
T = TypeVar("T")

LOCK_POLL_SECONDS = 0.005
"""How often ``held`` retries a busy threading lock on the async face."""

R = TypeVar("R")
Closer = Callable[[Any], Awaitable[object]]
_loop_resources: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[object, tuple[Any, Closer | None]]
] = weakref.WeakKeyDictionary()
_resources_lock = threading.Lock()

_loop: ContextVar[asyncio.AbstractEventLoop | None] = ContextVar("memstore_face_loop", default=None)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The loop whose async face the calling code runs on, or ``None`` on the sync face (a thread
    the core starts does not inherit the face: ContextVars do not cross into new threads)."""
    loop = _loop.get()
    return loop if loop is not None and in_greenlet() else None


async def run_on_loop(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on the async face. Cancelling the awaiting task raises
    ``CancelledError`` at the core's current database call; its transaction is rolled back (the
    connection is invalidated), never committed half-way."""
    token = _loop.set(asyncio.get_running_loop())
    try:
        return await greenlet_spawn(partial(fn, *args, **kwargs))
    finally:
        _loop.reset(token)


async def bounded_on_loop(timeout: float, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``run_on_loop`` that stops waiting after ``timeout`` seconds with ``TimeoutError``, as the
    sync path's pool stops waiting for its thread: the call is cancelled and left to unwind (a
    hung server may take its time to release the connection) while the caller goes on."""
    return await _bounded(timeout, None, partial(fn, *args, **kwargs))


async def limited_on_loop(
    slots: asyncio.Semaphore, timeout: float, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> T:
    """``bounded_on_loop`` that first takes one of ``slots`` (waiting counts toward ``timeout``), as
    the sync path queues for one of its pool's threads; an abandoned call keeps its slot until it
    has unwound, as a hung call keeps its thread."""
    return await _bounded(timeout, slots, partial(fn, *args, **kwargs))


async def _bounded(timeout: float, slots: asyncio.Semaphore | None, call: Callable[[], T]) -> T:
    loop = asyncio.get_running_loop()
    started = loop.time()
    if slots is not None:
        try:
            async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancel
                await slots.acquire()
        except TimeoutError:
            raise TimeoutError(f"gave up after {timeout:.1f} s") from None

    async def in_slot() -> T:
        try:
            return await run_on_loop(call)
        finally:
            if slots is not None:
                slots.release()

    task = asyncio.ensure_future(in_slot())
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout - (loop.time() - started)))
    except asyncio.CancelledError:
        task.cancel()
        task.add_done_callback(_consume)
        raise
    if task in done:
        return task.result()
    task.cancel()
    task.add_done_callback(_consume)
    raise TimeoutError(f"gave up after {timeout:.1f} s")


async def awaited_within(timeout: float, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``run_on_loop`` in a task of its own that neither the caller's deadline nor its cancellation
    stops: the caller stops waiting after ``timeout`` (``TimeoutError``) and the call goes on, as a
    pool thread does (building the provider, which may migrate the database, must finish once)."""
    task = asyncio.ensure_future(run_on_loop(fn, *args, **kwargs))
    task.add_done_callback(_consume)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        raise TimeoutError(f"gave up after {timeout:.1f} s")
    return task.result()


def on_loop(fn: Callable[P, T]) -> Callable[P, Coroutine[Any, Any, T]]:
    """``fn`` as a coroutine function on the async face: the async API's functions are these."""

    @wraps(fn)
    async def on_the_loop(*args: P.args, **kwargs: P.kwargs) -> T:
        return await run_on_loop(fn, *args, **kwargs)

    on_the_loop.__doc__ = f"``{fn.__module__}.{fn.__name__}`` on the event loop.\n\n{fn.__doc__ or ''}"
    return on_the_loop


def bounded_here(timeout: float, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """From core code on the async face: ``bounded_on_loop`` (the sync core keeps its thread pools
    for the same bound)."""
    return await_only(bounded_on_loop(timeout, fn, *args, **kwargs))


def loop_resource(key: object, build: Callable[[], R], close: Closer | None = None) -> R:
    """The running loop's resource for ``key`` (an async HTTP client: its connections belong to
    the loop that opened them), built on first use. ``close_loop_resources`` closes a loop's;
    those of a loop that closed without it are dropped when another loop first asks."""
    loop = asyncio.get_running_loop()
    with _resources_lock:
        if loop not in _loop_resources:
            for closed in [other for other in _loop_resources if other.is_closed()]:
                del _loop_resources[closed]
        entries = _loop_resources.setdefault(loop, {})
        if key not in entries:
            entries[key] = (build(), close)
        return cast(R, entries[key][0])


async def close_loop_resources() -> None:
    """Close the running loop's resources (``memstore.aio.aclose``, at a server's shutdown)."""
    with _resources_lock:
        entries = _loop_resources.pop(asyncio.get_running_loop(), {})
    for resource, close in entries.values():
        if close is not None:
            await close(resource)


def _consume(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned call's outcome, so asyncio does not report it as never retrieved."""
    if not task.cancelled():
        task.exception()


def await_on_loop(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` from core code running on the async face (``running_loop()`` is set)."""
    return await_only(awaitable)


@contextmanager
def held(lock: threading.Lock) -> Iterator[None]:
    """``with lock`` for core code that does I/O while holding it: on the async face a busy lock is
    polled with ``asyncio.sleep``, since blocking would stall the very loop its holder needs."""
    if running_loop() is None:
        with lock:
            yield
        return
    while not lock.acquire(blocking=False):
        await_only(asyncio.sleep(LOCK_POLL_SECONDS))
    try:
        yield
    finally:
        lock.release()
