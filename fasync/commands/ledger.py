"""`fasync ledger`: the audit of a run's sample ledger across all its resumes (fasync.metrics.ledger)."""

from __future__ import annotations

from pathlib import Path

import typer

from fasync.commands import usage_error
from fasync.exit_codes import ExitCode


def run(run_dir: str) -> int:
    """0: every invariant holds, 1: one fails, 2: no run directory."""
    from fasync.atomic import DamagedFileError
    from fasync.metrics.ledger import audit_run

    try:
        result = audit_run(Path(run_dir))
    except (FileNotFoundError, DamagedFileError) as error:
        return usage_error(f"fasync ledger: {error}")
    typer.echo(result.report())
    return ExitCode.OK if result.ok else ExitCode.FAILED
