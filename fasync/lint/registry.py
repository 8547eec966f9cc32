"""The rule registry: every lint rule registers itself here with its documentation.

A rule is a function of the validated config and its derived quantities that yields findings; the linter
turns findings into located diagnostics. Rule modules (one family each) are imported by `fasync.lint.rules`.
A new rule needs its function, its `@rule(...)` entry and two examples in fasync/diagnostics/examples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Optional

from fasync.config.derived import Derived
from fasync.config.schema import FasyncConfig
from fasync.diagnostics import Code, Severity


@dataclass(frozen=True)
class Finding:
    key: str
    """Key path whose effective value the finding is about; its origin is reported as the location."""
    message: str
    help: Optional[str] = None


Check = Callable[[FasyncConfig, Derived], Iterable[Finding]]

RULES: dict[str, Code] = {}


def rule(code: str, name: str, severity: Severity, *, summary: str, what: str, why: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        if code in RULES:
            raise ValueError(f"duplicate rule code {code}")
        RULES[code] = Code(code, name, severity, summary, what, why, check)
        return check

    return register
