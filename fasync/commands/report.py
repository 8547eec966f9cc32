"""`fasync report`: charts of one or several runs and report.md (fasync.report)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import typer

from fasync.commands import usage_error
from fasync.exit_codes import ExitCode


def run(run_dirs: Sequence[str], out: str | None, labels: Sequence[str] | None) -> int:
    """Written into `out`, by default RUN_DIR/report for one run and ./report for several; 2 for bad input."""
    from fasync.report import ReportError, write_report

    target = Path(out) if out else (Path(run_dirs[0]) / "report" if len(run_dirs) == 1 else Path("report"))
    try:
        written = write_report(run_dirs, target, labels=labels or None)
    except ReportError as error:
        return usage_error(f"fasync report: {error}")
    typer.echo(f"fasync report: wrote {written} and its charts")
    return ExitCode.OK
