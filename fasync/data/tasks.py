"""Built-in verifiable tasks: digit puzzles a tiny model learns from reward alone.

Each problem is a prompt ending in "=" and the answer that should follow it.
Operands have `data.length` digits (leading zeros allowed), so every answer of a
task has the same width and a position-wise reward is meaningful:

- `reverse`: "408153=" → "351804"
- `copy`:    "408153=" → "408153"
- `sort`:    "408153=" → "013458"
- `add`:     "042+517=" → "0559" (both operands and the sum zero-padded; the sum has one digit more)

Prompts carry no instruction words: a run trains one task, and every extra
prompt token costs a tiny model compute without telling it anything.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

Messages = list[dict[str, str]]
"""A chat prompt: `{role, content}` messages, as the chat template takes them."""


@dataclass(frozen=True)
class Problem:
    prompt: Union[str, Messages]
    label: str
    """The reference answer as text (a number's text for a numeric one): what `(completion, label)` rewards get."""
    record: dict[str, Any] = field(default_factory=dict, compare=False)
    """The whole record the problem was read from (empty for a built-in task): the fields a reward may name
    (`data_source`, `extra_info`, ...)."""
    ground_truth: Any = field(default=None, compare=False)
    """The label as the record holds it (not made text); None for a built-in task, whose label is all it has."""


def _digits(rng: random.Random, length: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(length))


def reverse(rng: random.Random, length: int) -> Problem:
    digits = _digits(rng, length)
    return Problem(f"{digits}=", digits[::-1])


def copy(rng: random.Random, length: int) -> Problem:
    digits = _digits(rng, length)
    return Problem(f"{digits}=", digits)


def sort(rng: random.Random, length: int) -> Problem:
    digits = _digits(rng, length)
    return Problem(f"{digits}=", "".join(sorted(digits)))


def add(rng: random.Random, length: int) -> Problem:
    a, b = _digits(rng, length), _digits(rng, length)
    return Problem(f"{a}+{b}=", str(int(a) + int(b)).zfill(length + 1))


TASKS: dict[str, Callable[[random.Random, int], Problem]] = {
    "reverse": reverse,
    "copy": copy,
    "sort": sort,
    "add": add,
}


def generate_problems(task: str, length: int, count: int, seed: int) -> list[Problem]:
    """`count` problems of `task`, the same for the same seed."""
    make = TASKS[task]
    rng = random.Random(seed)
    return [make(rng, length) for _ in range(count)]
