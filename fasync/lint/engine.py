"""Running the lint rules on loaded configs and deciding the exit code.

`--select`/`--ignore` and the config's own `lint.ignore` take codes or code prefixes (`S0`
matches S001, S002, ...; `ALL` matches everything) and apply to rule diagnostics only: a
config that could not be loaded always reports why.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fasync.config.derived import derive
from fasync.config.loader import LoadResult, load_config
from fasync.config.problems import INTERNAL_ERROR, PROBLEMS, report
from fasync.diagnostics import Code, Diagnostic, Severity
from fasync.exit_codes import ExitCode
from fasync.lint.registry import RULES


def rules() -> dict[str, Code]:
    """The registered lint rules (importing the rule modules registers them)."""
    importlib.import_module("fasync.lint.rules")
    return RULES


def catalogue() -> dict[str, Code]:
    """Load problems and lint rules, by code."""
    return dict(sorted({**PROBLEMS, **rules()}.items()))


def matches(code: str, patterns: Sequence[str]) -> bool:
    return any(p == "ALL" or code.startswith(p) for p in patterns)


def lint(result: LoadResult, select: Sequence[str] | None = None,
         ignore: Sequence[str] | None = None) -> list[Diagnostic]:
    """The load diagnostics plus those of every selected rule, ordered by file and position."""
    found = list(result.diagnostics)
    if result.config is not None:
        found += _rule_diagnostics(result, select, list(ignore or ()) + list(result.config.lint.ignore))
    return sorted(found, key=_position)


def _rule_diagnostics(result: LoadResult, select: Sequence[str] | None, ignore: Sequence[str]) -> list[Diagnostic]:
    config = result.config
    derived = derive(config)
    out: list[Diagnostic] = []
    for rule in rules().values():
        if (select and not matches(rule.code, select)) or matches(rule.code, ignore):
            continue
        try:
            findings = list(rule.check(config, derived))
        except Exception as exc:  # noqa: BLE001 - one broken rule must not hide the others' findings
            out.append(report(INTERNAL_ERROR, f"rule {rule.code} ({rule.name}) crashed: {type(exc).__name__}: {exc}",
                              result.provenance.origin(()), "this is a bug in fasync; please report it with this config"))
            continue
        out += [Diagnostic(rule.code, rule.severity, f.message, f.key, result.provenance.origin(f.key), f.help)
                for f in findings]
    return out


def _position(diagnostic: Diagnostic) -> tuple:
    where = diagnostic.location
    return (where.file, where.line, where.column, diagnostic.code) if where else ("", 0, 0, diagnostic.code)


@dataclass
class CheckRun:
    diagnostics: list[Diagnostic]
    files: int
    unloadable: int
    """Files whose config could not be loaded."""


def check_files(files: Sequence[str | Path], overrides: Sequence[str] = (), select: Sequence[str] | None = None,
                ignore: Sequence[str] | None = None) -> CheckRun:
    diagnostics: list[Diagnostic] = []
    unloadable = 0
    for file in files:
        result = load_config(file, overrides)
        unloadable += result.config is None
        diagnostics += lint(result, select, ignore)
    return CheckRun(diagnostics, len(files), unloadable)


def exit_code(run: CheckRun, strict: bool = False, exit_zero: bool = False) -> ExitCode:
    """2 when a config could not be loaded; else 1 for errors (and warnings under strict) unless exit_zero."""
    if run.unloadable:
        return ExitCode.USAGE
    failing = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
    if exit_zero or not any(d.severity in failing for d in run.diagnostics):
        return ExitCode.OK
    return ExitCode.FAILED
