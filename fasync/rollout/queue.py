"""The bounded queue between the rollouter and the trainer (fully_async).

A full queue makes `put` wait, so the producer pauses instead of dropping;
`shutdown` wakes every waiter so that nobody hangs when the run ends. Items
leave in put order, or, with a `priority`, lowest priority first and in put
order among equals: the rollouter puts the groups of the oldest weights first,
so that a long completion that arrives late is not also queued behind the
short ones admitted after it, and does not go stale there.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable


class QueueClosed(Exception):
    pass


class GroupQueue:
    def __init__(self, max_size: int, priority: Callable[[object], int] | None = None):
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.max_size = max_size
        self.priority = priority
        self._items: list[tuple[int, int, object]] = []
        """A heap of (priority, put order, item)."""
        self._order = itertools.count()
        self._changed = asyncio.Condition()
        self._closed = False

    async def put(self, item) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._closed or len(self._items) < self.max_size)
            if self._closed:
                raise QueueClosed("queue is shut down")
            rank = self.priority(item) if self.priority is not None else 0
            heapq.heappush(self._items, (rank, next(self._order), item))
            self._changed.notify_all()

    async def get(self, count: int, timeout: float | None = None, ready: Callable[[], bool] | None = None) -> list:
        """The first `count` items, waiting until there are that many and `ready()` holds (re-read at every put and
        `recheck`); fewer only on timeout or shutdown."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(
                    lambda: self._closed or (len(self._items) >= count and (ready is None or ready()))), timeout)
            except asyncio.TimeoutError:
                pass
            taken = [heapq.heappop(self._items)[2] for _ in range(min(count, len(self._items)))]
            self._changed.notify_all()
            return taken

    def refill(self, items: list) -> None:
        """Put back what a checkpoint saved, in order, past `max_size` if need be (a resumed run's queue holds
        what the trainer had taken too); producers wait until it is below the bound again."""
        for item in items:
            rank = self.priority(item) if self.priority is not None else 0
            heapq.heappush(self._items, (rank, next(self._order), item))

    async def recheck(self) -> None:
        """Wake a `get` to look at its `ready` again (what it waits for changed without a put)."""
        async with self._changed:
            self._changed.notify_all()

    def size(self) -> int:
        return len(self._items)

    async def shutdown(self) -> list:
        """Close the queue and return what was left in it."""
        async with self._changed:
            self._closed = True
            left = [item for _, _, item in sorted(self._items)]
            self._items.clear()
            self._changed.notify_all()
            return left
