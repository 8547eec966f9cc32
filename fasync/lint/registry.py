"""The rule registry: every lint rule registers itself here with its documentation.

A rule is a function of the validated config and its derived quantities that
yields findings; the linter turns findings into located diagnostics. Rule
modules (one family each) are imported by `fasync.lint.rules`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from fasync.config.derived import Derived
from fasync.config.schema import FasyncConfig
from fasync.lint.diagnostic import Severity


@dataclass(frozen=True)
class Finding:
    key: str
    """Key path whose effective value the finding is about; its origin is reported as the location."""
    message: str
    help: Optional[str] = None


Check = Callable[[FasyncConfig, Derived], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: Severity
    summary: str
    what: str
    why: str
    bad_example: str
    """A config fragment that triggers the rule."""
    good_example: str
    """The same fragment, fixed."""
    check: Check


RULES: dict[str, Rule] = {}


def rule(code: str, name: str, severity: Severity, *, summary: str, what: str, why: str,
         bad_example: str, good_example: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        if code in RULES:
            raise ValueError(f"duplicate rule code {code}")
        RULES[code] = Rule(code, name, severity, summary, what, why, bad_example, good_example, check)
        return check

    return register
