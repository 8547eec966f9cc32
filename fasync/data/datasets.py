"""Prompt pools: a built-in task or a JSONL file, validated when built so a bad one stops the run early."""

from __future__ import annotations

import json
import random
from pathlib import Path

from fasync.config.schema import DataConfig
from fasync.data.tasks import Problem, generate_problems
from fasync.errors import ConfigurationError


class PromptDataset:
    """A fixed pool of problems, sampled with replacement."""

    def __init__(self, problems: list[Problem], source: str):
        self.problems = problems
        self.source = source

    def __len__(self) -> int:
        return len(self.problems)

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        return rng.choices(self.problems, k=n)


def load_jsonl(path: str, prompt_key: str, label_key: str) -> list[Problem]:
    """Problems from a JSONL file; labels that are numbers become strings. Blank lines are skipped."""
    file = Path(path)
    if not file.is_file():
        reason = "is a directory" if file.is_dir() else "does not exist"
        raise ConfigurationError(f"data.path: {path} {reason}")
    problems = []
    with file.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"data.path: {path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigurationError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from exc
            if not isinstance(record, dict):
                raise ConfigurationError(f"{where}: expected a JSON object, got {type(record).__name__}")
            for key, setting in ((prompt_key, "data.prompt_key"), (label_key, "data.label_key")):
                if key not in record:
                    keys = ", ".join(sorted(record)) or "none"
                    raise ConfigurationError(f"{where}: no key {key!r} ({setting}); the line has: {keys}")
            prompt = record[prompt_key]
            if not isinstance(prompt, str):
                raise ConfigurationError(f"{where}: {prompt_key!r} must be a string, got {type(prompt).__name__}")
            problems.append(Problem(prompt, str(record[label_key])))
    if not problems:
        raise ConfigurationError(f"data.path: {path} holds no records")
    return problems


def build_dataset(data_cfg: DataConfig) -> PromptDataset:
    """The configured pool: `data.path` when set, else the built-in `data.task`."""
    if data_cfg.path is not None:
        return PromptDataset(load_jsonl(data_cfg.path, data_cfg.prompt_key, data_cfg.label_key), data_cfg.path)
    if data_cfg.task is None:
        raise ConfigurationError("data: set data.task (a built-in task) or data.path (a JSONL file)")
    problems = generate_problems(data_cfg.task, data_cfg.length, data_cfg.num_prompts, data_cfg.seed)
    return PromptDataset(problems, f"task {data_cfg.task} (length {data_cfg.length})")
