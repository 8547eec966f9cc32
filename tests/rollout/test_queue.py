import asyncio

import pytest

from fasync.rollout.queue import GroupQueue, QueueClosed


def run(coro):
    return asyncio.run(coro)


def test_fifo_and_counts():
    async def body():
        queue = GroupQueue(4)
        for item in range(3):
            await queue.put(item)
        assert await queue.get(2) == [0, 1]
        await queue.put(3)
        assert await queue.get(2) == [2, 3]
        assert queue.size() == 0

    run(body())


def test_full_queue_pauses_the_producer_until_a_get():
    async def body():
        queue = GroupQueue(2)
        await queue.put("a")
        await queue.put("b")
        blocked = asyncio.create_task(queue.put("c"))
        await asyncio.sleep(0.05)
        assert not blocked.done() and queue.size() == 2
        assert await queue.get(1) == ["a"]
        await asyncio.wait_for(blocked, 1)
        assert await queue.get(2) == ["b", "c"]

    run(body())


def test_get_waits_for_a_whole_batch_and_times_out_with_what_there_is():
    async def body():
        queue = GroupQueue(8)
        await queue.put(1)
        assert await queue.get(3, timeout=0.05) == [1]
        waiter = asyncio.create_task(queue.get(2))
        await queue.put(2)
        await asyncio.sleep(0.02)
        assert not waiter.done()
        await queue.put(3)
        assert await asyncio.wait_for(waiter, 1) == [2, 3]

    run(body())


def test_shutdown_wakes_waiters_and_returns_leftovers():
    async def body():
        queue = GroupQueue(1)
        await queue.put("left")
        producer = asyncio.create_task(queue.put("late"))
        await asyncio.sleep(0.02)
        assert await queue.shutdown() == ["left"]
        with pytest.raises(QueueClosed):
            await asyncio.wait_for(producer, 1)
        assert await asyncio.wait_for(queue.get(5), 1) == []

    run(body())


def test_queue_must_hold_something():
    with pytest.raises(ValueError):
        GroupQueue(0)


def test_priority_takes_the_lowest_first_and_put_order_among_equals():
    async def body():
        queue = GroupQueue(8, priority=lambda item: item[0])
        for item in [(2, "a"), (1, "b"), (2, "c"), (1, "d"), (0, "e")]:
            await queue.put(item)
        assert await queue.get(3) == [(0, "e"), (1, "b"), (1, "d")]
        await queue.put((1, "f"))
        assert await queue.shutdown() == [(1, "f"), (2, "a"), (2, "c")]

    run(body())
