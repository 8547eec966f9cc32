"""The environment checks' diagnostics (E001-E008): their severities and how a finding is located, shared by
`fasync check --preflight` (fasync/preflight.py, which looks at the cluster, the packages, the model and the
dataset) and E007, the one environment check every lint runs: it only looks packages up."""

from __future__ import annotations

from fasync.config.loader import LoadResult
from fasync.diagnostics import Diagnostic, Severity

SEVERITIES = {"E001": Severity.ERROR, "E002": Severity.ERROR, "E003": Severity.ERROR, "E004": Severity.ERROR,
              "E005": Severity.ERROR, "E006": Severity.INFO, "E007": Severity.ERROR, "E008": Severity.ERROR}


def finding(result: LoadResult, code: str, key: str, message: str, help: str | None = None) -> Diagnostic:
    return Diagnostic(code, SEVERITIES[code], message, key, result.provenance.origin(key), help)


def missing_trackers(result: LoadResult) -> list[Diagnostic]:
    """E007 for each tracker `logging.backends` asks for whose package is not installed. It costs a package
    lookup (nothing is imported), so `fasync check` and `fasync train` run it on every config: a run must not
    start only to fail at its first metrics row."""
    from fasync.metrics.trackers import BACKENDS, missing

    if result.config is None:
        return []
    return [finding(result, "E007", "logging.backends", f"`logging.backends` asks for {name}, but the "
                    f"`{BACKENDS[name].module}` package is not installed here",
                    f"{BACKENDS[name].install}, or remove {name} from `logging.backends`")
            for name in missing(result.config.logging.backends)]
