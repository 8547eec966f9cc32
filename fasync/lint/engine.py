"""Running the lint rules on loaded configs and deciding the exit code.

`--select`/`--ignore` and the config's own `lint.ignore` take codes or code prefixes (`S0`
matches S001, S002, ...; `ALL` matches everything) and apply to rule diagnostics only: a
config that could not be loaded always reports why.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fasync.config.derived import Derived
from fasync.config.loader import LoadResult, load_config
from fasync.config.problems import INTERNAL_ERROR, PROBLEMS, report
from fasync.config.schema import FasyncConfig
from fasync.diagnostics import Code, Diagnostic, Severity
from fasync.exit_codes import ExitCode
from fasync.lint.environment import missing_trackers, unresolved_reward
from fasync.lint.registry import RULES, Finding, Fix
from fasync.memory import derive_with_model

TRACKERS_MISSING = "E007"
REWARD_UNRESOLVED = "E010"
"""The environment checks every lint runs (fasync/lint/environment.py): they only look packages and modules up."""


def rules() -> dict[str, Code]:
    """The registered lint rules (importing the rule modules registers them)."""
    importlib.import_module("fasync.lint.rules")
    return RULES


def catalogue() -> dict[str, Code]:
    """Load problems and lint rules, by code."""
    return dict(sorted({**PROBLEMS, **rules()}.items()))


def matches(code: str, patterns: Sequence[str]) -> bool:
    return any(p == "ALL" or code.startswith(p) for p in patterns)


def lint(result: LoadResult, select: Sequence[str] | None = None, ignore: Sequence[str] | None = None,
         derived: Derived | None = None) -> list[Diagnostic]:
    """The load diagnostics plus those of every selected rule, of E007 (a requested tracker that is not
    installed) and of E010 (a reward module that is not there), ordered by file and position. A config that did
    not load as written is linted as far as it did load (`LoadResult.partial`). `derived`: the loaded config's
    derived quantities where the caller has them (`fasync train` derives once for the lint and the run)."""
    found = list(result.diagnostics)
    config = result.config or result.partial
    if config is not None:
        ignored = list(ignore or ()) + list(config.lint.ignore)
        found += _rule_diagnostics(result, config, select, ignored, derived if result.config is not None else None)
        for code, check in ((TRACKERS_MISSING, missing_trackers), (REWARD_UNRESOLVED, unresolved_reward)):
            if (not select or matches(code, select)) and not matches(code, ignored):
                found += check(result)
    return sorted(found, key=_position)


_KEY = re.compile(r"`([a-z_]+\.[a-z_]+)")


def _assumptions(result: LoadResult, finding: Finding) -> str:
    """" [assumed: ...]" when the finding is about, or names, a key whose value was not the one written."""
    named = [finding.key] + _KEY.findall(finding.message)
    used = [key for key in dict.fromkeys(named) if key in result.assumed]
    return f" [assumed: {'; '.join(f'`{key}` {result.assumed[key]}' for key in used)}]" if used else ""


def _rule_diagnostics(result: LoadResult, config: FasyncConfig, select: Sequence[str] | None,
                      ignore: Sequence[str], derived: Derived | None) -> list[Diagnostic]:
    found, crashed = run_rules(config, select, ignore, derived)
    out = [report(INTERNAL_ERROR, f"rule {rule.code} ({rule.name}) crashed: {type(exc).__name__}: {exc}",
                  result.provenance.origin(()), "this is a bug in fasync; please report it with this config")
           for rule, exc in crashed]
    reported = _failing(found)
    for rule, finding in found:
        fixes = [fix.instruction() for fix in finding.fixes if _keeps_clean(fix, config, reported, ignore)]
        out.append(Diagnostic(rule.code, rule.severity, finding.message + _assumptions(result, finding), finding.key,
                              result.provenance.origin(finding.key), "; or ".join(fixes) or finding.help))
    return out


def run_rules(config: FasyncConfig, select: Sequence[str] | None = None, ignore: Sequence[str] = (),
              derived: Derived | None = None) -> tuple[list[tuple[Code, Finding]], list[tuple[Code, Exception]]]:
    """Every selected rule's findings on a validated config (derived here unless given), and the rules that
    crashed."""
    if derived is None:
        _, derived = derive_with_model(config)
    found, crashed = [], []
    for rule in rules().values():
        if (select and not matches(rule.code, select)) or matches(rule.code, ignore):
            continue
        try:
            found += [(rule, finding) for finding in rule.check(config, derived)]
        except Exception as exc:  # noqa: BLE001 - one broken rule must not hide the others' findings
            crashed.append((rule, exc))
    return found, crashed


def _failing(found: list[tuple[Code, Finding]]) -> set[tuple[str, str]]:
    return {(rule.code, finding.key) for rule, finding in found if rule.severity is not Severity.INFO}


def _keeps_clean(fix: Fix, config: FasyncConfig, reported: set[tuple[str, str]], ignore: Sequence[str]) -> bool:
    """Whether applying the fix leaves no warning or error that the config does not already have."""
    edited = fix.apply(config)
    if edited is None:
        return False
    found, crashed = run_rules(edited, None, ignore)
    return not crashed and _failing(found) <= reported


def _position(diagnostic: Diagnostic) -> tuple:
    where = diagnostic.location
    return (where.file, where.line, where.column, diagnostic.code) if where else ("", 0, 0, diagnostic.code)


@dataclass
class CheckRun:
    diagnostics: list[Diagnostic]
    files: int
    missing: int
    """Files named on the command line that do not exist: the check could not run on them."""


def check_files(files: Sequence[str | Path], overrides: Sequence[str] = (), select: Sequence[str] | None = None,
                ignore: Sequence[str] | None = None,
                environment: Callable[[LoadResult], list[Diagnostic]] | None = None) -> CheckRun:
    """Lint each file; with `environment` (`fasync check --preflight` hands in fasync.preflight.preflight), also
    check the live environment against it."""
    diagnostics: list[Diagnostic] = []
    for file in files:
        result = load_config(file, overrides)
        diagnostics += lint(result, select, ignore)
        if environment is not None:
            diagnostics += sorted(environment(result), key=_position)
    return CheckRun(diagnostics, len(files), sum(not Path(file).is_file() for file in files))


def exit_code(run: CheckRun, strict: bool = False, exit_zero: bool = False) -> ExitCode:
    """As ruff: 2 when the check could not run (a named file is missing, a rule crashed); else 1 for problems
    found in a config, load problems included (warnings too under strict), unless exit_zero."""
    if run.missing or any(d.code == INTERNAL_ERROR for d in run.diagnostics):
        return ExitCode.USAGE
    failing = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
    if exit_zero or not any(d.severity in failing for d in run.diagnostics):
        return ExitCode.OK
    return ExitCode.FAILED
