"""`fasync bench`: the same task trained in each mode, its tables written into docs/benchmarks.md
(fasync.bench)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import typer

from fasync.commands import usage_error
from fasync.exit_codes import ExitCode

DEFAULT_CONFIG = "configs/quickstart.yaml"


def run(config: str | None, overrides: Sequence[str], out: str | None, doc: str | None, long_tail: bool,
        repeats: int) -> int:
    """Every mode of `config` (default configs/quickstart.yaml); `doc` None leaves the document alone."""
    from fasync.bench.modes import LONG_TAIL
    from fasync.bench.report import benchmark
    from fasync.commands.train import run as train
    from fasync.errors import ConfigurationError

    try:
        _, blocks = benchmark(train, config or DEFAULT_CONFIG, overrides, out_dir=Path(out) if out else None,
                              doc=Path(doc) if doc is not None else None,
                              long_tail=LONG_TAIL if long_tail else None, repeats=repeats)
    except ConfigurationError as error:
        return usage_error(str(error))
    typer.echo("\n\n".join(blocks.values()))
    return ExitCode.OK
