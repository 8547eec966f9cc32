"""Stand-ins for Ray actors in tests that run the rollout's asyncio code in one process."""

import asyncio


class LocalMethod:
    """An actor method as fasync calls it: `.remote(...)` returns something to await, which yields to the event
    loop once (as a Ray call does) and then runs `fn` here."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        async def call():
            await asyncio.sleep(0)
            return self.fn(*args)

        return call()
