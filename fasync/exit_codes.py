"""The exit codes of every `fasync` command, as ruff uses them: 2 means the tool could not run."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    """Clean check, or a finished run."""
    FAILED = 1
    """Problems found in a config (errors, load problems included, or warnings under `--strict`), or a run that
    failed."""
    USAGE = 2
    """The tool could not run: bad usage, a file named on the command line that does not exist, an internal
    error."""
    INTERRUPTED = 130
    """A run stopped by Ctrl-C (128 + SIGINT)."""
    TERMINATED = 143
    """A run stopped by SIGTERM (128 + SIGTERM), as schedulers send on preemption; the same clean stop as
    Ctrl-C."""
