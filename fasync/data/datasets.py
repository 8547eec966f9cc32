"""Prompt pools: a built-in task or a dataset file, validated when built so a bad one stops the run early.

`build_dataset` reads the file (`fasync.data.records`: JSONL, JSON, parquet or a saved Hugging Face dataset) and
checks each record's prompt and label; `check_prompts` then holds every prompt against the tokenizer and the
model's context. Both run in the driver, before Ray starts, and name the file and line (or row) of the first bad
record. `load_records` is the whole of it for a caller that has only a `data` section (an eval set).
"""

from __future__ import annotations

import json
import random

from fasync.config.schema import DataConfig
from fasync.data.records import MISSING, lookup, read_records
from fasync.data.tasks import Messages, Problem, generate_problems
from fasync.errors import ConfigurationError


class MissingKey(ConfigurationError):
    """A record without the prompt or the label: `setting` names the key that looked for it."""

    def __init__(self, where: str, key: str, setting: str, present: str):
        super().__init__(f"data.path: {where}: no key {key!r} ({setting}); the line has: {present}")
        self.where, self.key, self.setting = where, key, setting


DEFAULT_LABEL_KEYS = ("label", "reward_model.ground_truth")
"""Where a record's answer is looked for when `data.label_key` is null: fasync's own key, then verl's."""


class PromptDataset:
    """A fixed pool of problems, drawn in epochs (each prompt once per epoch, reshuffled every epoch) or with
    replacement."""

    def __init__(self, problems: list[Problem], source: str, locations: list[str] | None = None,
                 epochs: bool = False, seed: int = 0):
        self.problems = problems
        self.source = source
        self.locations = locations
        """Where each problem was read (`file:line`, `file row N`); None for a built-in task."""
        self.epochs = epochs
        self.seed = seed
        self.filtered = 0
        """Overlong prompts `check_prompts` dropped (`data.overlong_prompts: filter`)."""
        self._last_order: tuple[tuple[int, int], list[int]] | None = None

    def __len__(self) -> int:
        return len(self.problems)

    def draw(self, cursor: int, count: int, rng: random.Random) -> list[int]:
        """The indices of draws `cursor .. cursor + count - 1`. In epochs they are a function of the cursor
        alone (epoch `e` is a permutation seeded by `data.seed` and `e`), so a resumed run draws what the
        original would have; with replacement they come from `rng`, whose state the checkpoint keeps."""
        if not self.epochs:
            return rng.choices(range(len(self.problems)), k=count)
        return [self._epoch_order(draw // len(self))[draw % len(self)] for draw in range(cursor, cursor + count)]

    def _epoch_order(self, epoch: int) -> list[int]:
        """Epoch `epoch`'s permutation of the pool. The last one is kept: a rollout's draws fall in one or two
        epochs, and shuffling the whole pool again for each draw cost the driver 35 ms a rollout of 32 draws
        from 4,096 prompts (docs/benchmarks.md, "The long tail's regression")."""
        key = (epoch, len(self.problems))
        if self._last_order is None or self._last_order[0] != key:
            order = list(range(len(self.problems)))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._last_order = (key, order)
        return self._last_order[1]

    def location(self, index: int) -> str:
        """Where problem `index` comes from: `file:line` (or row), or the built-in task."""
        return self.locations[index] if self.locations is not None else self.source

    def where(self, index: int) -> str:
        """The setting and place of problem `index`, to begin a message: `data.path: file:line`, or
        `data.task: task reverse (length 6), prompt 17`."""
        if self.locations is not None:
            return f"data.path: {self.location(index)}"
        return f"data.task: {self.location(index)}, prompt {index}"


def _prompt(value, key: str, where: str) -> str | Messages:
    """A record's prompt: text, or a list of `{role, content}` chat messages."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(
            isinstance(message, dict) and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str) for message in value):
        return [{"role": message["role"], "content": message["content"]} for message in value]
    shown = json.dumps(value, default=str)[:60]
    raise ConfigurationError(f"{where}: {key!r} must be a string or a list of chat messages ({{\"role\": ..., "
                             f"\"content\": ...}}), got {type(value).__name__} {shown}")


def _label(record: dict, label_key: str | None, where: str) -> tuple[str, object]:
    """The record's answer as text, and as the record holds it (`where`: the record's file and line)."""
    keys = (label_key,) if label_key is not None else DEFAULT_LABEL_KEYS
    key = next((key for key in keys if lookup(record, key) is not MISSING), None)
    if key is None:
        raise MissingKey(where, keys[0], "data.label_key", ", ".join(sorted(record)) or "none")
    label = lookup(record, key)
    if isinstance(label, bool) or not isinstance(label, (str, int, float)):
        # str() would make a label of null, true or a list into text no completion is meant to match
        raise ConfigurationError(
            f"data.path: {where}: {key!r} is {json.dumps(label, default=str)[:40]}, but a label must be a string (or a "
            "number, taken as its text); give every record its answer, or drop records without one")
    return str(label), label


def load_file(data_cfg: DataConfig) -> PromptDataset:
    """Problems from the dataset file at `data.path`, each record's prompt and label checked."""
    path = data_cfg.path
    problems, locations = [], []
    for where, record in read_records(path, data_cfg.format):
        prompt = lookup(record, data_cfg.prompt_key)
        if prompt is MISSING:
            raise MissingKey(where, data_cfg.prompt_key, "data.prompt_key", ", ".join(sorted(record)) or "none")
        text, value = _label(record, data_cfg.label_key, where)
        problems.append(Problem(_prompt(prompt, data_cfg.prompt_key, f"data.path: {where}"), text, record, value))
        locations.append(where)
    if not problems:
        raise ConfigurationError(f"data.path: {path} holds no records")
    return PromptDataset(problems, path, locations, epochs=data_cfg.sampling != "replacement", seed=data_cfg.seed)


def build_dataset(data_cfg: DataConfig) -> PromptDataset:
    """The configured pool: `data.path` when set, else the built-in `data.task`."""
    if data_cfg.path is not None:
        return load_file(data_cfg)
    if data_cfg.task is None:
        raise ConfigurationError("data: set data.task (a built-in task) or data.path (a dataset file)")
    problems = generate_problems(data_cfg.task, data_cfg.length, data_cfg.num_prompts, data_cfg.seed)
    return PromptDataset(problems, f"task {data_cfg.task} (length {data_cfg.length})",
                         epochs=data_cfg.sampling == "epoch", seed=data_cfg.seed)


def prompt_tokens(dataset: PromptDataset, index: int, tokenizer) -> int:
    """Tokens of problem `index`'s prompt as the model is fed it; a ConfigurationError naming the record when the
    tokenizer cannot encode it."""
    try:
        return len(tokenizer.format_prompt(dataset.problems[index].prompt))
    except ValueError as exc:
        embedded = hasattr(tokenizer, "alphabet")
        hint = ("The embedded tokenizer knows printable ASCII and newline; set `model.path` to a Hugging Face model "
                "whose tokenizer covers this text, or clean the dataset" if embedded else
                "Fix the record, or build prompts without the template (`data.chat_template: false`)")
        raise ConfigurationError(f"{dataset.where(index)}: {exc}. {hint}") from None


def check_prompts(dataset: PromptDataset, tokenizer, context: int | None, data_cfg: DataConfig) -> PromptDataset:
    """Every prompt must tokenize (the embedded tokenizer knows a fixed alphabet), be at most
    `data.max_prompt_tokens` long when that is set, and leave room in the model's `context` (prompt + completion
    tokens; None: unknown) for at least one completion token. An overlong prompt stops the run, or with
    `data.overlong_prompts: filter` is dropped: the dataset returned holds the rest and counts the drops."""
    limit = data_cfg.max_prompt_tokens
    kept = []
    for index in range(len(dataset)):
        tokens = prompt_tokens(dataset, index, tokenizer)
        fills_context = context is not None and tokens >= context
        if not fills_context and (limit is None or tokens <= limit):
            kept.append(index)
        elif data_cfg.overlong_prompts == "fail" and fills_context:
            raise ConfigurationError(
                f"{dataset.where(index)}: the prompt is {tokens} tokens, but the model's context is {context} "
                "tokens (prompt and completion together), which leaves no room to generate. Drop or shorten the "
                "prompt, use a model with a longer context (the embedded model's: `model.max_seq_len`), or set "
                "`data.overlong_prompts: filter`")
        elif data_cfg.overlong_prompts == "fail":
            raise ConfigurationError(
                f"{dataset.where(index)}: the prompt is {tokens} tokens, above `data.max_prompt_tokens` {limit}. "
                "Raise the limit, shorten the prompt, or set `data.overlong_prompts: filter` to drop such prompts")
    if len(kept) == len(dataset):
        return dataset
    if not kept:
        raise ConfigurationError(f"data: every one of the {len(dataset)} prompts of {dataset.source} is overlong "
                                 "(`data.overlong_prompts: filter` dropped them all)")
    filtered = PromptDataset([dataset.problems[i] for i in kept], dataset.source,
                             None if dataset.locations is None else [dataset.locations[i] for i in kept],
                             dataset.epochs, dataset.seed)
    filtered.filtered = len(dataset) - len(kept)
    return filtered


def load_records(data_cfg: DataConfig, tokenizer=None, context: int | None = None) -> PromptDataset:
    """The problems a `data` section describes, each record checked, and with a tokenizer, each prompt held
    against it and the model's `context` (`check_prompts`). For any caller with a data section: an eval set
    loads the way the training set does."""
    dataset = build_dataset(data_cfg)
    return dataset if tokenizer is None else check_prompts(dataset, tokenizer, context, data_cfg)
