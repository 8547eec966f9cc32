"""What each `fasync` command does, one module per command; `fasync.cli` only parses the command line and calls
the command's `run`, which prints and returns the exit code.

Each module imports what its command needs inside `run`, so that `fasync check` loads only the check path
(never torch, ray or vllm).
"""

from __future__ import annotations

import os
import sys

import typer

from fasync.exit_codes import ExitCode


def usage_error(message: str) -> ExitCode:
    """Say on stderr why the command could not run; the exit code for it."""
    typer.echo(message, err=True)
    return ExitCode.USAGE


def use_color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ
