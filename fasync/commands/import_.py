"""`fasync import`: a fasync config from another framework's settings (fasync.migrate), linted as `fasync check`
lints it. (The module's name avoids the keyword.)"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

import typer


def run(framework: str, sources: Sequence[str], out: str | None) -> int:
    """Write (or print) the config, then lint it; exits as `fasync check` does on the result."""
    from fasync.lint.engine import check_files, exit_code
    from fasync.lint.formats import render
    from fasync.migrate import import_config

    text, _ = import_config(framework, sources)
    if out:
        Path(out).write_text(text, encoding="utf-8")
        target = out
    else:
        typer.echo(text)
        target = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False).name
        Path(target).write_text(text, encoding="utf-8")
    checked = check_files([target])
    typer.echo(render(checked.diagnostics, "text", files=1), err=True)
    if not out:
        Path(target).unlink()
    return exit_code(checked)
