"""Where simulated prompt groups get their prompt and completion lengths (`simulate.lengths`).

Prompt lengths always come from the dataset, tokenized as the engines will see them. Completion lengths:

- `data`: each prompt's label, tokenized, plus the stop token, capped at `rollout.max_new_tokens`: what a
  policy that has learned the task generates. A group shares its prompt's length.
- `run`: the mean completion length of each step of the calibration run (`response_length_mean` in its
  metrics.jsonl). A step's mean hides the spread inside it, so this understates a tail.
- a list: drawn from, per prompt or per sample (`simulate.per`).
- `{median, sigma}`: a lognormal tail, capped at `rollout.max_new_tokens`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional

from fasync.config.schema import FasyncConfig, LengthTail
from fasync.errors import ConfigurationError


@dataclass
class Lengths:
    """Draws (prompt length, the group's completion lengths) for one prompt group at a time."""

    prompts: list[int]
    """Prompt length of each problem in the pool."""
    answers: Optional[list[int]]
    """With `data`: each problem's completion length; else None (drawn from `draw`)."""
    n: int
    max_new_tokens: int
    per_prompt: bool
    rng: random.Random
    values: Optional[list[int]] = None
    tail: Optional[LengthTail] = None
    source: str = "data"

    def group(self) -> tuple[int, list[int]]:
        index = int(self.rng.random() * len(self.prompts))
        if self.answers is not None:
            return self.prompts[index], [self.answers[index]] * self.n
        if self.per_prompt:
            return self.prompts[index], [self._draw()] * self.n
        return self.prompts[index], [self._draw() for _ in range(self.n)]

    def _draw(self) -> int:
        if self.values is not None:
            return min(self.rng.choice(self.values), self.max_new_tokens)
        length = self.tail.median * math.exp(self.tail.sigma * self.rng.gauss(0.0, 1.0))
        return max(1, min(round(length), self.max_new_tokens))

    @property
    def longest(self) -> int:
        if self.answers is not None:
            return max(self.answers)
        return min(max(self.values), self.max_new_tokens) if self.values is not None else self.max_new_tokens


def build_lengths(cfg: FasyncConfig, run_lengths: Optional[list[float]] = None) -> Lengths:
    """The length source the config names; `run_lengths` are the calibration run's step means."""
    from fasync.data import build_dataset
    from fasync.model import build_tokenizer

    dataset = build_dataset(cfg.data)
    tokenizer = build_tokenizer(cfg.model, cfg.data)
    limit = cfg.rollout.max_new_tokens
    prompts = [len(tokenizer.format_prompt(problem.prompt)) for problem in dataset.problems]
    chosen = cfg.simulate.lengths
    common = dict(prompts=prompts, n=cfg.rollout.n_samples_per_prompt, max_new_tokens=limit,
                  per_prompt=cfg.simulate.per == "prompt", rng=random.Random(cfg.simulate.seed))
    if chosen == "data":
        stop = 1 if tokenizer.stop_token_ids else 0
        answers = [min(len(tokenizer.encode(problem.label)) + stop, limit) for problem in dataset.problems]
        return Lengths(answers=answers, source=f"data: the labels of {dataset.source}", **common)
    if chosen == "run":
        if not run_lengths:
            raise ConfigurationError("simulate.lengths: `run` takes the lengths of the --calibrate run, and none "
                                     "was given (or its metrics.jsonl has no response_length_mean)")
        values = [max(1, round(value)) for value in run_lengths]
        return Lengths(answers=None, values=values, source="run: the calibration run's mean step lengths", **common)
    if isinstance(chosen, list):
        return Lengths(answers=None, values=list(chosen), source=f"a list of {len(chosen)} lengths", **common)
    return Lengths(answers=None, tail=chosen, source=f"lognormal tail, median {chosen.median:g}, sigma "
                   f"{chosen.sigma:g}", **common)
