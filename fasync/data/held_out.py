"""The eval set: `eval.path`, or `eval.held_out_prompts` of the training data, which training then never draws
(`split_held_out` makes the same split for both, from `data.seed`).

It is read with the training data's loader (fasync.data) and checked against the tokenizer and the model's
context in the driver, before Ray starts, like the training prompts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fasync.config.schema import FasyncConfig
from fasync.data.datasets import PromptDataset, build_dataset, check_prompts
from fasync.errors import ConfigurationError


@dataclass(frozen=True)
class EvalPrompts:
    dataset: PromptDataset
    """The eval prompts, evaluated in order."""
    data_sources: list[str | None]
    """Each prompt's `data_source` (None: the record has none), which groups the `eval/<data_source>/` metrics."""

    def __len__(self) -> int:
        return len(self.dataset)


def subset(dataset: PromptDataset, indices: list[int]) -> PromptDataset:
    """The problems at `indices`, keeping where each came from and how they are drawn."""
    locations = None if dataset.locations is None else [dataset.locations[i] for i in indices]
    return PromptDataset([dataset.problems[i] for i in indices], dataset.source, locations, dataset.epochs,
                         dataset.seed)


def split_held_out(dataset: PromptDataset, count: int, seed: int) -> tuple[PromptDataset, PromptDataset]:
    """(the training part, the `count` prompts held out), chosen with `seed`: the same split every time, so that
    the training data (`fasync.rollout.groups.build_factory`) and the eval set agree without sharing state."""
    if count >= len(dataset):
        raise ConfigurationError(f"eval.held_out_prompts: {count} would hold out every prompt of {dataset.source} "
                                 f"({len(dataset)}), leaving none to train on; hold out fewer, or set eval.path")
    held = set(random.Random(seed).sample(range(len(dataset)), count))
    return (subset(dataset, [i for i in range(len(dataset)) if i not in held]),
            subset(dataset, sorted(held)))


def training_part(dataset: PromptDataset, cfg: FasyncConfig) -> PromptDataset:
    """The prompts training draws from: all of them, or all but `eval.held_out_prompts`."""
    if cfg.eval.path is None and cfg.eval.held_out_prompts:
        return split_held_out(dataset, cfg.eval.held_out_prompts, cfg.data.seed)[0]
    return dataset


def build_eval_prompts(cfg: FasyncConfig, tokenizer, context: int | None) -> EvalPrompts | None:
    """The configured eval set (its first `eval.max_prompts`), checked as the training prompts are; None when the
    config evaluates nothing. Raises ConfigurationError naming the file and line of a bad record."""
    spec = cfg.eval
    if spec.path is not None:
        dataset = build_dataset(cfg.data.model_copy(update={"path": spec.path}))
    elif spec.held_out_prompts:
        dataset = split_held_out(build_dataset(cfg.data), spec.held_out_prompts, cfg.data.seed)[1]
    elif spec.enabled:
        raise ConfigurationError("eval: evaluation is on (eval.every or eval.before_train) but there is nothing "
                                 "to evaluate; set eval.path (a dataset file) or eval.held_out_prompts")
    else:
        return None
    if spec.max_prompts is not None and spec.max_prompts < len(dataset):
        dataset = subset(dataset, list(range(spec.max_prompts)))
    dataset = check_prompts(dataset, tokenizer, context, cfg.data)
    return EvalPrompts(dataset, [_data_source(problem.record) for problem in dataset.problems])


def _data_source(record: dict) -> str | None:
    source = record.get("data_source")
    return None if source is None else str(source)
