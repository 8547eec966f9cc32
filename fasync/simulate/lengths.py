"""Where simulated prompt groups get their prompt and completion lengths (`simulate.lengths`).

Prompt lengths always come from the dataset, tokenized as the engines will see them. Completion lengths:

- `data`: each prompt's label, tokenized, plus the stop token, capped at `rollout.max_new_tokens`: what a
  policy that has learned the task generates. A group shares its prompt's length.
- `run`: the mean completion length of each step of the calibration run (`response_length_mean` in its
  metrics.jsonl). A step's mean hides the spread inside it, so this understates a tail.
- a list: drawn from, per prompt or per sample (`simulate.per`).
- `{median, sigma}`: a lognormal tail, capped at `rollout.max_new_tokens`.

These are the lengths of a policy that has learned when to stop. One still learning runs many answers to
`rollout.max_new_tokens` first (`simulate.learning`): each completion does so with a share that depends on
the optimizer steps behind the weights that generate it, falling linearly from all to none over `{steps}`,
or as the calibration run's mean lengths imply at each of its steps (`run`): a step of mean length m, where
the learned lengths average μ and the limit is L, had (m − μ) / (L − μ) of its completions at the limit.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
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
    full_shares: Optional[list[float]] = None
    """`simulate.learning`: the share of completions at `max_new_tokens` from weights after each optimizer step;
    past the end, the last share."""

    def group(self, policy_steps: int) -> tuple[int, list[int]]:
        """A prompt and its group's completion lengths, from weights that have taken `policy_steps` optimizer
        steps."""
        index = int(self.rng.random() * len(self.prompts))
        if self.answers is not None:
            lengths = [self.answers[index]] * self.n
        elif self.per_prompt:
            lengths = [self._draw()] * self.n
        else:
            lengths = [self._draw() for _ in range(self.n)]
        share = self.full_share(policy_steps)
        if share > 0:
            lengths = [self.max_new_tokens if self.rng.random() < share else length for length in lengths]
        return self.prompts[index], lengths

    def full_share(self, policy_steps: int) -> float:
        shares = self.full_shares
        if not shares:
            return 0.0
        return shares[min(policy_steps, len(shares) - 1)]

    def learned_mean(self) -> float:
        """The mean completion length of a policy that has learned (what `lengths` describes)."""
        if self.answers is not None:
            return sum(self.answers) / len(self.answers)
        if self.values is not None:
            return sum(min(v, self.max_new_tokens) for v in self.values) / len(self.values)
        draws = random.Random(0)
        count = 4096
        return sum(max(1, min(round(self.tail.median * math.exp(self.tail.sigma * draws.gauss(0.0, 1.0))),
                              self.max_new_tokens)) for _ in range(count)) / count

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
    """The length source the config names, with its learning phase; `run_lengths` are the calibration run's
    step means, in step order."""
    learning = cfg.simulate.learning
    if learning == "run" and cfg.simulate.lengths == "run":
        raise ConfigurationError("simulate.learning: `run` reads the learning phase from the --calibrate run's "
                                 "lengths, measured against the learned lengths; `simulate.lengths: run` takes "
                                 "them from the same run (use data, a list or {median, sigma} with it)")
    lengths = _learned_lengths(cfg, run_lengths)
    if cfg.model.path is not None and not Path(cfg.model.path).exists():
        lengths.source += f"; prompts counted in characters ({cfg.model.path} is not on this machine)"
    if learning is None:
        return lengths
    limit = cfg.rollout.max_new_tokens
    if learning == "run":
        if not run_lengths:
            raise ConfigurationError("simulate.learning: `run` takes the lengths of the --calibrate run, and none "
                                     "was given (or its metrics.jsonl has no response_length_mean)")
        learned = lengths.learned_mean()
        span = limit - learned
        lengths.full_shares = [min(max((mean - learned) / span, 0.0), 1.0) if span > 0 else 0.0
                               for mean in run_lengths]
        lengths.source += "; learning as the calibration run's mean lengths imply"
    else:
        lengths.full_shares = [1 - step / learning.steps for step in range(learning.steps)] + [0.0]
        lengths.source += f"; learning: at {limit} tokens, all at first, none after {learning.steps} optimizer steps"
    return lengths


def planning_tokenizer(cfg: FasyncConfig):
    """The engines' tokenizer, or, for a `model.path` that is not on this machine (a run planned for a cluster),
    the embedded one: prompts are then counted in characters."""
    from fasync.model import build_tokenizer

    if cfg.model.path is not None and not Path(cfg.model.path).exists():
        return build_tokenizer(cfg.model.model_copy(update={"path": None}), cfg.data, chat=cfg.rollout.agentic)
    return build_tokenizer(cfg.model, cfg.data, chat=cfg.rollout.agentic)


def _learned_lengths(cfg: FasyncConfig, run_lengths: Optional[list[float]]) -> Lengths:
    from fasync.data import build_dataset

    dataset = build_dataset(cfg.data)
    tokenizer = planning_tokenizer(cfg)
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
