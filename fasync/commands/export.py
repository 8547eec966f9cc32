"""`fasync export`: a checkpoint's policy written for use elsewhere (fasync.checkpoint.state.export_run)."""

from __future__ import annotations

from pathlib import Path

import typer

from fasync.commands import usage_error
from fasync.exit_codes import ExitCode


def run(run_dir: str, out: str, step: int | None, force: bool = False, merge: bool = False) -> int:
    """0: written, 1: the checkpoint cannot be used (or `out` cannot be written), 2: no run directory."""
    from fasync.atomic import RunFileError, describe_os_error
    from fasync.errors import ConfigurationError

    directory = Path(run_dir)
    if not (directory / "config.yaml").is_file():
        return usage_error(f"fasync export: {run_dir}: not a fasync run directory (no config.yaml)")
    from fasync.checkpoint.state import export_run

    try:
        found, files = export_run(directory, step, Path(out), force, merge)
    except (RunFileError, ConfigurationError) as error:
        typer.echo(f"fasync export: {error}", err=True)
        return ExitCode.FAILED
    except OSError as error:
        typer.echo(f"fasync export: cannot write {describe_os_error(out, error)}", err=True)
        return ExitCode.FAILED
    typer.echo(f"fasync export: {found.path.name} (step {found.step}) written to {out}: {', '.join(files)}")
    return ExitCode.OK
