"""`fasync report`: charts of one or several runs and report.md (fasync.report)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import typer

from fasync.commands import usage_error
from fasync.exit_codes import ExitCode


def run(run_dirs: Sequence[str], out: str | None, labels: Sequence[str] | None) -> int:
    """Written into `out`, by default RUN_DIR/report for one run and ./report for several; 2 for bad input, 1
    when the report cannot be written."""
    from fasync.atomic import describe_os_error
    from fasync.report import ReportError, write_report

    target = Path(out) if out else (Path(run_dirs[0]) / "report" if len(run_dirs) == 1 else Path("report"))
    if target.exists() and not target.is_dir():
        return usage_error(f"fasync report: {target}: is a file, not a directory; -o names the directory to write "
                           "report.md and its charts into")
    try:
        written = write_report(run_dirs, target, labels=labels or None)
    except ReportError as error:
        return usage_error(f"fasync report: {error}")
    except OSError as error:
        typer.echo(f"fasync report: cannot write {describe_os_error(error.filename or target, error)}", err=True)
        return ExitCode.FAILED
    typer.echo(f"fasync report: wrote {written} and its charts")
    return ExitCode.OK
