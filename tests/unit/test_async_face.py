"""``memstore.async_face``'s own rules: per-loop resources, bounds, slots and cancellation."""

from __future__ import annotations

import asyncio
import gc

import pytest

from memstore.async_face import (
    _loop_resources,
    awaited_within,
    close_loop_resources,
    limited_on_loop,
    loop_resource,
    running_loop,
)


class Client:
    closed = 0

    async def close(self) -> None:
        Client.closed += 1


async def _close(client: Client) -> None:
    await client.close()


def test_a_resource_is_one_per_loop_and_closed_with_it() -> None:
    Client.closed = 0

    async def twice() -> tuple[Client, Client]:
        first = loop_resource("client", Client, _close)
        return first, loop_resource("client", Client, _close)

    async def closing() -> tuple[Client, Client]:
        pair = await twice()
        await close_loop_resources()
        return pair

    first, again = asyncio.run(closing())
    assert first is again and Client.closed == 1
    other, _ = asyncio.run(twice())  # another loop, another client
    assert other is not first
    gc.collect()
    asyncio.run(twice())  # a loop that closed without closing its resources is dropped now
    assert sum(1 for loop in _loop_resources if loop.is_closed()) == 0


def test_core_code_knows_its_face() -> None:
    assert running_loop() is None

    async def main() -> bool:
        from memstore.async_face import run_on_loop

        return await run_on_loop(lambda: running_loop() is not None)

    assert asyncio.run(main()) is True


def test_slots_bound_the_calls_at_once_and_come_back_after_cancels_and_timeouts() -> None:
    async def main() -> tuple[int, int]:
        slots = asyncio.Semaphore(2)
        running = peak = 0

        def work() -> None:
            nonlocal running, peak
            from sqlalchemy.util import await_only

            running += 1
            peak = max(peak, running)
            try:
                await_only(asyncio.sleep(0.05))
            finally:
                running -= 1

        calls = [asyncio.ensure_future(limited_on_loop(slots, 5, work)) for _ in range(10)]
        calls[3].cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        with pytest.raises(TimeoutError):
            await limited_on_loop(slots, 0.01, lambda: _sleep(1.0))
        await asyncio.sleep(1.1)  # the abandoned call unwinds and gives its slot back
        return peak, slots._value

    peak, free = asyncio.run(main())
    assert peak == 2 and free == 2


def _sleep(seconds: float) -> None:
    from sqlalchemy.util import await_only

    await_only(asyncio.sleep(seconds))


def test_a_shielded_call_goes_on_after_the_caller_stops_waiting() -> None:
    finished: list[str] = []

    def slow() -> str:
        _sleep(0.2)
        finished.append("done")
        return "done"

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await awaited_within(0.01, slow)
        await asyncio.sleep(0.4)

    asyncio.run(main())
    assert finished == ["done"]
