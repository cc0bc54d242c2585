"""The client's bound on transactions outstanding at once (``in_flight_max``): free places
are taken at once, the rest wait in turn, and a waiter cancelled before or after it was
handed a place never keeps one."""

from __future__ import annotations

import asyncio

import pytest

from store.client.client import InFlightLimit
from store.core.errors import InvalidRequest


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_places_are_taken_at_once_then_waited_for_first_come_first_served() -> None:
    async def main() -> None:
        limit = InFlightLimit(2)
        assert limit.take()
        await limit.wait()
        assert limit.free == 0 and not limit.take()
        order: list[int] = []

        async def later(n: int) -> None:
            await limit.wait()
            order.append(n)

        tasks = [asyncio.create_task(later(n)) for n in range(3)]
        await _settle()
        assert order == [] and len(limit.waiters) == 3
        limit.release()
        await _settle()
        assert order == [0] and limit.free == 0  # the place went to the first waiter
        limit.release()
        limit.release()
        await _settle()
        assert order == [0, 1, 2] and limit.free == 0
        limit.release()  # the two holders left (waiters 1 and 2) give theirs back
        limit.release()
        assert limit.free == 2 and not limit.waiters
        await asyncio.gather(*tasks)

    asyncio.run(main())


def test_a_cancelled_waiter_keeps_no_place() -> None:
    async def main() -> None:
        limit = InFlightLimit(1)
        await limit.wait()

        async def waiter() -> None:
            await limit.wait()

        # Cancelled while waiting: the next release goes to the one behind it.
        first, second = asyncio.create_task(waiter()), asyncio.create_task(waiter())
        await _settle()
        first.cancel()
        await _settle()
        limit.release()
        await _settle()
        assert second.done() and not second.cancelled() and limit.free == 0
        # Handed the place, then cancelled before it ran: the place is passed on.
        third = asyncio.create_task(waiter())
        await _settle()
        limit.release()  # third's future now holds the place...
        third.cancel()  # ...but it is cancelled before it resumes
        await _settle()
        assert third.cancelled()
        assert limit.free == 1 and not limit.waiters, (limit.free, limit.waiters)

    asyncio.run(main())


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="in_flight_max must be at least 1"):
        InFlightLimit(0)
