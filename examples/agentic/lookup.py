"""Look it up: a tool task the model cannot solve without the tool.

Every trajectory draws a fresh digit that only the `get` tool returns. The model must call it
(`<tool_call>{"name": "get"}</tool_call>`) and then answer with the digit it read: the answer is the first
character of its next turn. Without the tool a player finds the digit 1 time in 10.

The reward is shaped, and every part of it is stated here and in docs/agentic.md:

- 0.2 for calling the tool, and 0.8 more when the answer is the digit the tool returned;
- a first turn that is not a readable call gets 0.2 × the share of the call's tokens it begins with, in the run's
  tokens, and the trajectory ends there: an answer without the call earns nothing, since the value cannot be
  known without it. lookup.yaml makes the whole call one token (`model.added_tokens`), so there a first turn earns
  the call's 0.2 whole or nothing; with the embedded vocabulary as built in, the call is 17 tokens and the credit
  grows with the share of them written in place.

A reward of 0.9 or more on average therefore needs the right digit at least 7 times in 8 (0.2 + 0.8 × 7/8 = 0.9):
a player that calls the tool and guesses gets 0.28 on average, one that never calls it at most 0.2. The format
credit exists so that the value's reward is ever seen: a call the model does not write never shows it.

The tool writes the digit three times (`777`), so the observation has one length, the digit always sits at the
same places before the answer, and the embedded 2-layer model has three places to read it from: with the digit
written once, trial runs stayed at the chance of guessing for 250 to 900 rollouts before they learnt to quote it,
and some settled for good on quoting only a few of the ten digits (docs/agentic.md).
"""

import random

from fasync.rollout.env_loop import Step

CALL = '<tool_call>{"name": "get"}</tool_call>'
"""The call the model must learn to write (the Hermes format `rollout.tool_parser: hermes` reads)."""
COPIES = 3
"""How many times the tool writes the digit."""


def call_credit(text: str, call_pieces: list[str]) -> float:
    """The share of the call's tokens (`call_pieces`, their texts in order) that `text` begins with. Credit for
    tokens in place anywhere lets the model settle on a repeat that earns some places, while a right beginning only
    grows towards the call."""
    right, at = 0, 0
    for piece in call_pieces:
        if not text.startswith(piece, at):
            break
        right, at = right + 1, at + len(piece)
    return right / len(call_pieces)


class Lookup:
    def __init__(self):
        self.value = str(random.randrange(10))
        self.called = False
        self.call_pieces: list[str] = []
        self.tools = {"get": self.get}

    async def get(self):
        self.called = True
        return self.value * COPIES

    async def reset(self, task):
        self.call_pieces = [task.tokenizer.decode([token]) for token in task.tokenizer.encode(CALL)]
        return [{"role": "user", "content": "value?"}]

    async def step(self, model_text):
        if not self.called:
            return Step(reward=0.2 * call_credit(model_text, self.call_pieces), done=True)
        return Step(reward=0.2 + 0.8 * (model_text.strip()[:1] == self.value), done=True)
