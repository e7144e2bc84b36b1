"""The Redis session store's clients, on both faces (``memstore.async_face``).

On the sync face the store talks through one ``redis.Redis``. On the async face it must not block
the event loop, so it talks through a ``redis.asyncio.Redis`` of the running loop (one per loop:
an asyncio connection belongs to the loop that opened it), with the same URL, timeouts and retry
policy, and awaits each reply with ``await_on_loop``. ``RedisClients.run`` is the one place that
decides: the store hands it ``call(link)``, written once against either client, and gets the
reply on both faces (a coroutine awaited, a pipeline's ``execute()`` included; a ``scan_iter``,
sync or async, collected into a list).

``close_loop_clients()`` closes the running loop's clients of every store; ``memstore.aio.aclose``
calls it at a server's shutdown.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.retry
from redis.backoff import NoBackoff
from redis.retry import Retry

from memstore.async_face import await_on_loop, running_loop

TIMEOUT_SECONDS = 5.0
"""Connect and socket timeout: a Redis that does not answer fails the call instead of hanging it."""

_OPTIONS: dict[str, Any] = {
    "decode_responses": True,
    "socket_timeout": TIMEOUT_SECONDS,
    "socket_connect_timeout": TIMEOUT_SECONDS,
}


@dataclass(frozen=True)
class Link:
    """A client (``redis.Redis`` or ``redis.asyncio.Redis``) and the store's scripts registered on it."""

    client: Any
    scripts: dict[str, Any]

    @classmethod
    def on(cls, client: Any, scripts: Mapping[str, str]) -> Link:
        return cls(client, {name: client.register_script(body) for name, body in scripts.items()})

    def script(self, name: str, *, keys: list[str], args: list[str | int]) -> Any:
        return self.scripts[name](keys=keys, args=args)

    def pipelined(self, commands: Sequence[tuple[Any, ...]], *, transaction: bool = False) -> Any:
        """``commands`` (each ``(name, *args)``) in one round trip; ``transaction``: in MULTI/EXEC.
        They buffer on both faces; the reply is ``execute()``'s (a coroutine on the async face)."""
        pipe = self.client.pipeline(transaction=transaction)
        for name, *args in commands:
            getattr(pipe, name)(*args)
        return pipe.execute()


class RedisClients:
    """The sync client, and on the async face the running loop's client."""

    def __init__(self, url: str, scripts: Mapping[str, str]) -> None:
        self._url = url
        self._scripts = dict(scripts)
        # No retries: a script whose reply was lost may have run, and running an append twice
        # would store its turns twice. The caller sees SessionStoreUnavailableError instead.
        self._sync = Link.on(redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **_OPTIONS), scripts)
        self._loop_links: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Link] = (
            weakref.WeakKeyDictionary()
        )
        _OPEN.add(self)

    def run(self, call: Callable[[Link], Any]) -> Any:
        """``call(link)`` on this face's client; its reply, awaited on the async face."""
        loop = running_loop()
        if loop is None:
            return _settled(call(self._sync))
        link = self._loop_links.get(loop)
        if link is None:
            client = redis.asyncio.Redis.from_url(
                self._url, retry=redis.asyncio.retry.Retry(NoBackoff(), 0), **_OPTIONS
            )
            link = self._loop_links[loop] = Link.on(client, self._scripts)
        reply = call(link)
        if inspect.isawaitable(reply):
            return await_on_loop(reply)
        if isinstance(reply, AsyncIterator):
            return await_on_loop(_collected(reply))
        return reply

    def close(self) -> None:
        """Close the sync client (an event loop's client is closed on its loop: ``aclose_loop``)."""
        self._sync.client.close()
        self._sync.client.connection_pool.disconnect()

    async def aclose_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        link = self._loop_links.pop(loop, None)
        if link is not None:
            await link.client.aclose(close_connection_pool=True)


def _settled(reply: Any) -> Any:
    """A sync reply as is; a ``scan_iter`` as the list of what it yields."""
    return list(reply) if isinstance(reply, Iterator) else reply


async def _collected(names: AsyncIterator[Any]) -> list[Any]:
    return [name async for name in names]


_OPEN: weakref.WeakSet[RedisClients] = weakref.WeakSet()


async def close_loop_clients() -> None:
    """Close the running loop's clients of every Redis session store (``memstore.aio.aclose``)."""
    loop = asyncio.get_running_loop()
    for clients in list(_OPEN):
        await clients.aclose_loop(loop)
