"""`fasync check`, and the commands that explain what it reports: `rules`, `rule`, `config show` and `schema`.

None of them starts anything: they read configs and print.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

import typer

from fasync.commands import usage_error, use_color
from fasync.exit_codes import ExitCode


def run(files: Sequence[str], overrides: Sequence[str], select: Sequence[str] | None, ignore: Sequence[str] | None,
        format: str, strict: bool, exit_zero: bool, quiet: bool, preflight: bool) -> int:
    """Lint `files`: 0 clean, 1 problems found, 2 the check could not run (`fasync check --help`)."""
    from fasync.lint.engine import check_files, exit_code
    from fasync.lint.formats import render
    from fasync.preflight import preflight as check_environment

    try:
        checked = check_files(files, overrides, select, ignore, environment=check_environment if preflight else None)
    except Exception as exc:  # noqa: BLE001 - a bug in fasync must read as "could not run", never as findings
        return usage_error(f"fasync check: internal error, please report it with this config: "
                           f"{type(exc).__name__}: {exc}")
    output = render(checked.diagnostics, format, summary=not quiet, files=checked.files,
                    color=format == "text" and use_color())
    if output and not _write(output):
        return ExitCode.USAGE
    return exit_code(checked, strict=strict, exit_zero=exit_zero)


def _write(text: str, nl: bool = True) -> bool:
    """Print `text` on stdout; False, with one line on stderr, when stdout refuses it (a full disk, /dev/full):
    the command could not deliver its result, whatever `--exit-zero` says about findings."""
    from fasync.atomic import describe_os_error

    try:
        typer.echo(text, nl=nl)
        sys.stdout.flush()
    except OSError as error:
        # What is left in stdout's buffer would fail again, with a traceback, when Python flushes it at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        typer.echo(f"fasync: cannot write the output: {describe_os_error('stdout', error)}", err=True)
        return False
    return True


def _written(text: str, nl: bool = True) -> int:
    return ExitCode.OK if _write(text, nl) else ExitCode.USAGE


def rules(format: str) -> int:
    """Every diagnostic code: load problems (F...) and lint rules."""
    from fasync.docs import rules_table

    return _written(rules_table(format))


def rule(code: str) -> int:
    """One rule explained: what it does, why it matters, a failing and a fixed example."""
    from fasync.lint.engine import catalogue

    entry = catalogue().get(code.upper())
    if entry is None:
        return usage_error(f"fasync rule: unknown code {code!r}; `fasync rules` lists them")
    return _written(entry.as_markdown())


def config_show(file: str, overrides: Sequence[str], format: str, as_framework: str | None) -> int:
    """The resolved config, where each value was set, and the derived quantities; or with `as_framework` the batch
    geometry, mode and staleness in that framework's own terms."""
    from fasync.config.loader import load_config
    from fasync.config.show import show
    from fasync.lint.formats import render

    result = load_config(file, overrides)
    if result.config is None:
        typer.echo(render(result.diagnostics, "text", files=1, color=use_color()), err=True)
        return ExitCode.FAILED if Path(file).is_file() else ExitCode.USAGE
    if as_framework is not None:
        from fasync.config.derived import derive
        from fasync.migrate import express, render_expressed

        expressed = express(as_framework, result.config, derive(result.config))
        return _written(render_expressed(expressed, file), nl=False)
    from fasync.memory import derive_with_model

    _, derived = derive_with_model(result.config)
    return _written(show(result, derived, format))


def schema() -> int:
    """The config's JSON Schema (draft-07)."""
    from fasync.docs import render_schema_json

    return _written(render_schema_json(), nl=False)
