"""`fasync import`: a fasync config from another framework's settings (fasync.migrate), linted as `fasync check`
lints it. (The module's name avoids the keyword.)"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Sequence

import typer

from fasync.exit_codes import ExitCode


def run(framework: str, sources: Sequence[str], out: str | None, env: Sequence[str] = ()) -> int:
    """Write (or print) the config, then lint it; exits as `fasync check` does on the result, and 1 with one
    line when the import itself fails (fasync.frameworks.common.ImportFailure)."""
    from fasync.frameworks.common import ImportFailure
    from fasync.lint.engine import check_files, exit_code
    from fasync.lint.formats import render
    from fasync.migrate import import_config, missing_task

    try:
        environment = _environment(env)
        target = _writable(out, sources) if out else None
        text, imported = import_config(framework, list(sources), environment)
        if target:
            _write(target, text)
    except ImportFailure as failure:
        typer.echo(f"fasync import: {failure}", err=True)
        return ExitCode.FAILED
    if not target:
        typer.echo(text)
        with tempfile.TemporaryDirectory() as folder:
            checked_path = Path(folder) / "imported.yaml"
            checked_path.write_text(text, encoding="utf-8")
            checked = check_files([checked_path])
            report = render(checked.diagnostics, "text", files=1).replace(str(checked_path), "(the config above)")
    else:
        checked = check_files([target])
        report = render(checked.diagnostics, "text", files=1)
    needed = missing_task(framework, imported)
    if checked.diagnostics or not needed:  # "All checks passed!" only where the config trains the source's task
        typer.echo(report, err=True)
    if needed:
        typer.echo(f"fasync import: {needed}", err=True)
        return ExitCode.FAILED
    return exit_code(checked)


def _environment(env: Sequence[str]) -> dict[str, str]:
    from fasync.frameworks.common import ImportFailure

    environment = {}
    for item in env:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ImportFailure(f"--env {item}: write it as VAR=VALUE")
        environment[name] = value
    return environment


def _writable(out: str, sources: Sequence[str]) -> Path:
    """-o's path, refused where writing it would fail or overwrite a SOURCE."""
    from fasync.frameworks.common import ImportFailure

    target = Path(out)
    if target.is_dir():
        raise ImportFailure(f"-o {out}: a directory; name the file to write")
    if not target.parent.is_dir():
        raise ImportFailure(f"-o {out}: the directory {target.parent} does not exist")
    for source in sources:
        if Path(source).exists() and target.exists() and os.path.samefile(source, target):
            raise ImportFailure(f"-o {out}: that is SOURCE {source}; write the fasync config to another file")
    return target


def _write(target: Path, text: str) -> None:
    from fasync.frameworks.common import ImportFailure

    try:
        target.write_text(text, encoding="utf-8")
    except OSError as error:
        raise ImportFailure(f"-o {target}: cannot be written ({error.strerror or error})") from None
