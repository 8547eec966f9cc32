"""A diagnostic: what the loader or a rule reports about a config, and where."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Optional


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
