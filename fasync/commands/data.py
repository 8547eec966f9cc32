"""`fasync data show`: the prompts a run builds from its data, as the model is fed them.

Each prompt is printed whole, after the chat template, the system prompt and the tokenizer's special tokens,
with its token count, its label and the record it came from: what a user checks before training on a new
dataset or model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import typer

from fasync.commands import use_color
from fasync.exit_codes import ExitCode


def show(file: str, overrides: Sequence[str], count: int) -> int:
    """0: the prompts were built and printed; 1: the config or the data has a problem (said in one line)."""
    from fasync.config.loader import load_config
    from fasync.data.datasets import build_dataset, prompt_tokens
    from fasync.errors import ConfigurationError
    from fasync.lint.formats import render
    from fasync.model.tokenizer import build_tokenizer

    result = load_config(file, overrides)
    if result.config is None:
        typer.echo(render(result.diagnostics, "text", files=1, color=use_color()), err=True)
        return ExitCode.FAILED if Path(file).is_file() else ExitCode.USAGE
    cfg = result.config
    try:
        dataset = build_dataset(cfg.data)
        tokenizer = build_tokenizer(cfg.model, cfg.data, chat=cfg.rollout.agentic)
        shown = [(index, prompt_tokens(dataset, index, tokenizer)) for index in range(min(count, len(dataset)))]
    except ConfigurationError as error:
        typer.echo(f"fasync data show: {error}", err=True)
        return ExitCode.FAILED
    sampling = cfg.data.sampling or ("epoch" if dataset.epochs else "replacement")
    typer.echo(f"{dataset.source}: {len(dataset):,} prompts, drawn by {sampling}; the first {len(shown)} as built:")
    for index, tokens in shown:
        problem = dataset.problems[index]
        typer.echo(f"\n── prompt {index + 1} · {dataset.location(index)} · {tokens} tokens · label {problem.label!r}")
        typer.echo(tokenizer.prompt_text(problem.prompt))
    return ExitCode.OK
