"""Look it up: a tool task the model cannot solve without the tool.

Every trajectory draws a fresh two-digit value that only the `get` tool returns; the model must call it
(`<tool_call>{"name": "get"}</tool_call>`) and then answer with the value it read. Guessing scores 1 time in 100.
"""

import random

from fasync.rollout.env_loop import Step


class Lookup:
    def __init__(self):
        self.value = f"{random.randrange(100):02d}"
        self.tools = {"get": self.get}

    async def get(self):
        return self.value

    async def reset(self, task):
        return [{"role": "user", "content": "value?"}]

    async def step(self, model_text):
        return Step(reward=float(model_text.strip() == self.value), done=True)
