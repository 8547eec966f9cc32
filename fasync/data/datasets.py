"""Prompt pools: a built-in task or a JSONL file, validated when built so a bad one stops the run early.

`build_dataset` reads the file (each line's size, encoding, JSON and keys); `check_prompts` then holds every
prompt against the tokenizer and the model's context. Both run in the driver, before Ray starts, and name
the file and line of the first bad record.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from fasync.config.schema import DataConfig
from fasync.data.tasks import Problem, generate_problems
from fasync.errors import ConfigurationError

MAX_LINE_BYTES = 4 << 20
"""Longest dataset line fasync reads: 4 MiB, a million tokens of English text, more than any model's
context. A longer line is refused before it is decoded or parsed: a stray binary or concatenated file would
otherwise reach the engines whole (a 50 MB prompt grew an engine past 15 GB)."""


class PromptDataset:
    """A fixed pool of problems, sampled with replacement."""

    def __init__(self, problems: list[Problem], source: str, lines: list[int] | None = None):
        self.problems = problems
        self.source = source
        self.lines = lines
        """The file line of each problem; None for a built-in task."""

    def __len__(self) -> int:
        return len(self.problems)

    def sample_indices(self, n: int, rng: random.Random) -> list[int]:
        """`n` indices into `problems`, drawn with replacement."""
        return rng.choices(range(len(self.problems)), k=n)

    def location(self, index: int) -> str:
        """Where problem `index` comes from: `file:line`, or the built-in task."""
        return f"{self.source}:{self.lines[index]}" if self.lines is not None else self.source

    def where(self, index: int) -> str:
        """The setting and place of problem `index`, to begin a message: `data.path: file:line`, or
        `data.task: task reverse (length 6), prompt 17`."""
        if self.lines is not None:
            return f"data.path: {self.location(index)}"
        return f"data.task: {self.location(index)}, prompt {index}"


def read_lines(file: Path):
    """(line number, text) for each line of `file`, refusing an over-long line or one that is not UTF-8."""
    with file.open("rb") as stream:
        number = 0
        while raw := stream.readline(MAX_LINE_BYTES + 1):
            number += 1
            where = f"data.path: {file}:{number}"
            if len(raw) > MAX_LINE_BYTES:
                raise ConfigurationError(
                    f"{where}: the line is longer than {MAX_LINE_BYTES >> 20} MiB, the most fasync reads for one "
                    "record; no model's context holds a prompt that long. Check that the file is the JSONL dataset "
                    "meant (one record per line), and drop or split this record")
            try:
                yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                column = len(raw[: exc.start].decode("utf-8", errors="replace")) + 1
                raise ConfigurationError(
                    f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {column}). Save the file as "
                    "UTF-8, e.g. `iconv -f latin1 -t utf-8 in.jsonl > out.jsonl` for Latin-1 text") from None


def load_jsonl(path: str, prompt_key: str, label_key: str) -> PromptDataset:
    """Problems from a JSONL file; labels that are numbers become strings, other labels that are not strings are
    refused. Blank lines are skipped."""
    file = Path(path)
    if not file.is_file():
        reason = "is a directory" if file.is_dir() else "does not exist"
        raise ConfigurationError(f"data.path: {path} {reason}")
    problems, lines = [], []
    for number, line in read_lines(file):
        if not line.strip():
            continue
        where = f"data.path: {path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from exc
        except RecursionError:
            raise ConfigurationError(f"{where}: the JSON is nested too deeply to read; a record is one object of "
                                     "strings, e.g. {\"prompt\": \"...\", \"label\": \"...\"}") from None
        if not isinstance(record, dict):
            raise ConfigurationError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for key, setting in ((prompt_key, "data.prompt_key"), (label_key, "data.label_key")):
            if key not in record:
                keys = ", ".join(sorted(record)) or "none"
                raise ConfigurationError(f"{where}: no key {key!r} ({setting}); the line has: {keys}")
        prompt = record[prompt_key]
        if not isinstance(prompt, str):
            raise ConfigurationError(f"{where}: {prompt_key!r} must be a string, got {type(prompt).__name__}")
        label = record[label_key]
        if isinstance(label, bool) or not isinstance(label, (str, int, float)):
            # str() would make a label of null, true or a list into text no completion is meant to match
            raise ConfigurationError(
                f"{where}: {label_key!r} is {json.dumps(label)[:40]}, but a label must be a string (or a number, "
                "taken as its text); give every record its answer, or drop records without one")
        problems.append(Problem(prompt, str(label)))
        lines.append(number)
    if not problems:
        raise ConfigurationError(f"data.path: {path} holds no records")
    return PromptDataset(problems, path, lines)


def build_dataset(data_cfg: DataConfig) -> PromptDataset:
    """The configured pool: `data.path` when set, else the built-in `data.task`."""
    if data_cfg.path is not None:
        return load_jsonl(data_cfg.path, data_cfg.prompt_key, data_cfg.label_key)
    if data_cfg.task is None:
        raise ConfigurationError("data: set data.task (a built-in task) or data.path (a JSONL file)")
    problems = generate_problems(data_cfg.task, data_cfg.length, data_cfg.num_prompts, data_cfg.seed)
    return PromptDataset(problems, f"task {data_cfg.task} (length {data_cfg.length})")


def check_prompts(dataset: PromptDataset, tokenizer, context: int | None) -> None:
    """Every prompt must tokenize (the embedded tokenizer knows a fixed alphabet) and leave room in the
    model's `context` (prompt + completion tokens; None: unknown) for at least one completion token."""
    for index, problem in enumerate(dataset.problems):
        try:
            prompt_tokens = len(tokenizer.format_prompt(problem.prompt))
        except ValueError as exc:
            raise ConfigurationError(
                f"{dataset.where(index)}: {exc}. The embedded tokenizer knows printable ASCII and newline; set "
                "`model.path` to a Hugging Face model whose tokenizer covers this text, or clean the dataset"
            ) from None
        if context is not None and prompt_tokens >= context:
            raise ConfigurationError(
                f"{dataset.where(index)}: the prompt is {prompt_tokens} tokens, but the model's context is {context} "
                "tokens (prompt and completion together), which leaves no room to generate. Drop or shorten the "
                "prompt, or use a model with a longer context (the embedded model's: `model.max_seq_len`)")
