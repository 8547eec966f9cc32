"""Look it up: a tool task the model cannot solve without the tool.

Every trajectory draws a fresh two-digit value that only the `get` tool returns. The model must call it
(`<tool_call>{"name":"get"}</tool_call>`) and then answer with the value it read; guessing finds it 1 time in 100.

The reward is shaped, and every part of it is stated here and in docs/agentic.md:

- 0.8 for an answer that is exactly the value the tool returned, and 0.2 for each of its two digits in place
  otherwise (at most 0.4: a right value with anything after it);
- 0.2 for calling the tool; a first turn that is not a readable call gets 0.2 × the share of the call's tokens it
  begins with (`<tool_call>` and `</tool_call>` are one token each), and the trajectory ends there.

A reward of 0.9 or more on average therefore needs the exact value at least 7 times in 8: the format credit alone
is worth 0.2, and the value is worth nothing without the tool. The format credit exists because the call is 16
tokens of JSON that a randomly initialised model would never write by chance, so without it the value's reward
would never be seen.
"""

import random
import re

from fasync.rollout.env_loop import Step

CALL = '<tool_call>{"name":"get"}</tool_call>'
"""The call the model must learn to write (the Hermes format `rollout.tool_parser: hermes` reads)."""
_TAGS = re.compile(r"(<tool_call>|</tool_call>)")


def units(text: str) -> list[str]:
    """The text as the embedded tokenizer splits it: the tool-call tags one unit each, every other character one."""
    return [unit for piece in _TAGS.split(text) if piece
            for unit in ([piece] if _TAGS.fullmatch(piece) else list(piece))]


def call_credit(text: str) -> float:
    """The share of the call, in units, that `text` begins with. Credit for units in place anywhere lets the model
    settle on a repeat that earns some places (the quote holds four of the call's; trial runs settled on a row of
    quotes, then on quotes and n's in turn), while a right beginning only grows towards the call."""
    right = 0
    for wanted, said in zip(units(CALL), units(text)):
        if wanted != said:
            break
        right += 1
    return right / len(units(CALL))


class Lookup:
    def __init__(self):
        self.value = f"{random.randrange(100):02d}"
        self.called = False
        self.tools = {"get": self.get}

    async def get(self):
        self.called = True
        return self.value

    async def reset(self, task):
        return [{"role": "user", "content": "value?"}]

    async def step(self, model_text):
        if not self.called:
            return Step(reward=0.2 * call_credit(model_text) + 0.8 * (model_text.strip() == self.value), done=True)
        answer = model_text.strip()
        if answer == self.value:
            return Step(reward=1.0, done=True)
        return Step(reward=0.2 + 0.2 * sum(a == b for a, b in zip(answer[:2], self.value)), done=True)
