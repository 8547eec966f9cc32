"""Diagnostics and the catalogue of their codes: what the loader (F codes) or a lint rule reports about a
config, and where.

A leaf: `fasync.config` and `fasync.lint` both import it, and it imports neither. Each code's examples are
real YAML files in `examples/` (`<CODE>_bad.yaml` is reported, on the line marked `# <- CODE` for a lint
rule; `<CODE>_good.yaml` is the same config fixed): the docs render them and the tests lint them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Optional

EXAMPLES = Path(__file__).resolve().parent / "examples"


def show_value(value) -> str:
    """A value as a message writes it, as in YAML flow style: null, true, 0.001, "hf", [0.5, 2.0]."""
    return json.dumps(value, ensure_ascii=False, default=str)


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Location:
    file: str
    """Path of the layer that set the value, `<cli>` for an override."""
    line: int
    column: int


@dataclass(frozen=True)
class Diagnostic:
    code: str
    severity: Severity
    message: str
    key: Optional[str]
    """Dotted key path (`train.global_batch_size`), None for file-level problems."""
    location: Optional[Location]
    help: Optional[str] = None

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("location")
        out["severity"] = self.severity.value
        out["file"] = self.location.file if self.location else None
        out["line"] = self.location.line if self.location else None
        out["column"] = self.location.column if self.location else None
        return out


@dataclass(frozen=True)
class Code:
    """One entry of the catalogue (`fasync rules`, docs/rules.md): a load problem or a lint rule."""

    code: str
    name: str
    severity: Severity
    summary: str
    what: str
    why: str
    check: Optional[Callable[..., Any]] = None
    """A lint rule's check, `(config, derived) -> findings`; None for a load problem, which the loader reports."""

    @property
    def bad_example(self) -> str:
        """A config that is reported (fasync/diagnostics/examples/<CODE>_bad.yaml)."""
        return self._example("bad")

    @property
    def good_example(self) -> str:
        """The same config, fixed."""
        return self._example("good")

    def as_markdown(self) -> str:
        """The entry as Markdown (docs/rules.md, `fasync rule`, SARIF's help): what it does, why it matters, a
        failing and a fixed example."""
        return "\n".join([
            f"## {self.code} `{self.name}` ({self.severity.value})", "",
            self.summary, "",
            "**What it does.** " + self.what, "",
            "**Why it matters.** " + self.why, "",
            "**Example** (reported):", "", "```yaml", self.bad_example.rstrip(), "```", "",
            "Fixed:", "", "```yaml", self.good_example.rstrip(), "```", "",
        ])

    def _example(self, kind: str) -> str:
        return (EXAMPLES / f"{self.code}_{kind}.yaml").read_text(encoding="utf-8")
