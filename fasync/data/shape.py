"""The token lengths of a built-in task's prompts and answers, known from the config alone.

The linter (G002, M003, M004) and the memory estimate read them; both run without torch, so this needs only the
task generators and the embedded tokenizer."""

from __future__ import annotations

import random
from dataclasses import dataclass

from fasync.config.schema import FasyncConfig
from fasync.data.tasks import TASKS
from fasync.model.tokenizer import build_tokenizer


@dataclass(frozen=True)
class TaskShape:
    task: str
    prompt_tokens: int
    """Tokens the embedded tokenizer feeds the model for one prompt (BOS included)."""
    answer_tokens: int
    """Tokens of the reference answer (every answer of a built-in task has the same width)."""


def builtin_task_shape(cfg: FasyncConfig) -> TaskShape | None:
    """Prompt and answer lengths of a built-in task under the embedded tokenizer; None for a JSONL
    dataset or a Hugging Face tokenizer, whose lengths only the data and the tokenizer know."""
    if cfg.data.path is not None or cfg.model.path is not None or cfg.data.task is None:
        return None
    problem = TASKS[cfg.data.task](random.Random(0), cfg.data.length)
    prompt = build_tokenizer(cfg.model, cfg.data).format_prompt(problem.prompt)
    return TaskShape(cfg.data.task, len(prompt), len(problem.label))
