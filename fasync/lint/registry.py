"""The rule registry: every lint rule registers itself here with its documentation.

A rule is a function of the validated config and its derived quantities that yields findings; the linter
turns findings into located diagnostics. Rule modules (one family each) are imported by `fasync.lint.rules`.
A finding may carry `Fix`es, edits the engine verifies by linting the edited config. A new rule needs its
function, its `@rule(...)` entry and two examples in fasync/diagnostics/examples (docs/check.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import ValidationError

from fasync.config.derived import Derived
from fasync.config.schema import FasyncConfig
from fasync.diagnostics import Code, Severity, show_value


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()
"""A fix edit that removes a key, so that its default (often a derived value) applies."""


@dataclass(frozen=True)
class Fix:
    """A change to the config that resolves a finding. The engine applies each fix to the config and offers only
    those that leave no new warning or error."""

    edits: tuple[tuple[str, Any], ...]
    """(dotted key, new value or DEFAULT), applied together."""
    effect: str = ""
    """What the config then does, in words."""

    def instruction(self) -> str:
        """What to change, as the help line says it: "set `key: value` and remove `other` (what it then does)"."""
        changes = " and ".join(f"remove `{key}`" if value is DEFAULT else f"set `{key}: {show_value(value)}`"
                               for key, value in self.edits)
        return f"{changes} ({self.effect})" if self.effect else changes

    def apply(self, cfg: FasyncConfig) -> FasyncConfig | None:
        """The config with this fix applied, keeping what it writes apart from its defaults; None when the fix
        does not validate."""
        data = cfg.model_dump(by_alias=True, exclude_unset=True)
        for key, value in self.edits:
            *sections, name = key.split(".")
            node = data
            for section in sections:
                node = node.setdefault(section, {})
            if value is DEFAULT:
                node.pop(name, None)
            else:
                node[name] = value
        try:
            return FasyncConfig.model_validate(data)
        except ValidationError:
            return None


@dataclass(frozen=True)
class Finding:
    key: str
    """Key path whose effective value the finding is about; its origin is reported as the location."""
    message: str
    help: Optional[str] = None
    """Advice in words, given when none of the fixes applies cleanly."""
    fixes: tuple[Fix, ...] = ()


Check = Callable[[FasyncConfig, Derived], Iterable[Finding]]

RULES: dict[str, Code] = {}


def rule(code: str, name: str, severity: Severity, *, summary: str, what: str, why: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        if code in RULES:
            raise ValueError(f"duplicate rule code {code}")
        RULES[code] = Code(code, name, severity, summary, what, why, check)
        return check

    return register
