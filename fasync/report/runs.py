"""A run directory as the report reads it: its metrics rows, checked line by line, and what its config says.

Every number comes from `metrics.jsonl` through the metric registry (fasync/metrics/registry.py) and the
benchmark's measurements (fasync/metrics/measure.py), so the report shows the figures `fasync bench` and
`summary.json` show, computed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from fasync.errors import ConfigurationError
from fasync.metrics.registry import METRICS


class ReportError(ConfigurationError):
    """A run directory the report cannot read. The message names the file (and line) and says what to do."""


@dataclass
class Run:
    path: Path
    label: str
    rows: list[dict]
    """The metrics rows, in file order, each with `wall_time` made continuous across resumes."""
    mode: Optional[str] = None
    target: Optional[float] = None
    """`train.target_reward` of the run's config, if it set one."""
    max_staleness: Optional[int] = None
    """`async.max_weight_staleness` (versions); 0 for sync."""
    max_lag: Optional[int] = None
    """The policy lag bound in optimizer steps (`Derived.max_lag`); None when unbounded or unknown."""
    engines: int = 1
    resumes: int = 0
    """How many times the run was resumed (a resumed run appends to its metrics.jsonl)."""
    config: dict = field(default_factory=dict)

    def series(self, name: str) -> tuple[list[float], list[float], list[float]]:
        """(optimizer steps, wall seconds, values) of metric `name`, one point per row, or per rollout
        (its last row) for a rollout-scope metric."""
        metric = METRICS[name]
        rows = self.rows
        if metric.scope == "rollout":
            rows = list({row["rollout"]: row for row in rows}.values())
        kept = [row for row in rows if isinstance(row.get(name), (int, float))]
        return ([row["step"] for row in kept], [row["wall_time"] for row in kept],
                [float(row[name]) for row in kept])


def _hint_for_directory(path: Path) -> str:
    # Two levels down: a `fasync bench --out` directory holds scenario/run/metrics.jsonl.
    inside = sorted(str(child) for pattern in ("*/metrics.jsonl", "*/*/metrics.jsonl") for child in path.glob(pattern))[:5]
    if inside:
        return ("pass the run directories themselves: " + ", ".join(str(Path(p).parent) for p in inside)
                + (" ..." if len(inside) == 5 else ""))
    return "pass a directory `fasync train` wrote (runs/<name>-<time>/), which holds metrics.jsonl and config.yaml"


def read_rows(metrics: Path) -> tuple[list[dict], int]:
    """The step rows of a metrics.jsonl (`fasync.metrics.writer.read_metrics_log`, which every command reads it
    with) and the number of resume markers; a ReportError for an empty file or a line that is not a complete
    row."""
    from fasync.atomic import DamagedFileError
    from fasync.metrics.writer import read_metrics_log

    try:
        log = read_metrics_log(metrics, cut_last_line="refuse")
    except DamagedFileError as error:
        raise ReportError(str(error)) from None
    if not log.rows:
        raise ReportError(f"{metrics}: empty, the run wrote no optimizer step; it stopped before its first step "
                          "(its summary.json or the `fasync train` output says why)")
    return log.rows, len(log.resumes)


def continuous_wall_time(rows: list[dict]) -> int:
    """Make `wall_time` continuous in place: a resumed run's clock restarts at 0 when it reopens the file,
    so each later segment is shifted to start where the one before it ended. Returns the restarts."""
    offset, previous, restarts = 0.0, 0.0, 0
    for row in rows:
        if row["wall_time"] + offset < previous:
            offset = previous
            restarts += 1
        row["wall_time"] = row["wall_time"] + offset
        previous = row["wall_time"]
    return restarts


def _from_config(raw: dict) -> dict:
    """mode, target, max_staleness, max_lag and engines from a resolved config; what does not validate is
    left out (a run written by another fasync version still reports its metrics)."""
    from pydantic import ValidationError

    from fasync.config.derived import derive
    from fasync.config.schema import FasyncConfig

    if not raw:
        return {}  # no config.yaml: defaults would claim a mode the run may not have had
    try:
        cfg = FasyncConfig.model_validate(raw)
    except ValidationError:
        mode = raw.get("mode")
        return {"mode": mode} if isinstance(mode, str) else {}
    return {"mode": cfg.mode, "target": cfg.train.target_reward,
            "max_staleness": 0 if cfg.mode == "sync" else cfg.async_.max_weight_staleness,
            "max_lag": derive(cfg).max_lag.steps, "engines": cfg.resources.num_rollout_engines}


def load_run(path: str | Path, label: Optional[str] = None) -> Run:
    path = Path(path)
    if not path.exists():
        raise ReportError(f"{path}: no such directory; pass a run directory written by `fasync train`")
    if not path.is_dir():
        raise ReportError(f"{path}: not a directory; " + ("pass the run directory that holds it"
                                                          if path.name == "metrics.jsonl" else _hint_for_directory(path.parent)))
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ReportError(f"{path}: not a run directory, it has no metrics.jsonl; {_hint_for_directory(path)}")
    rows, markers = read_rows(metrics)
    # A resumed run marks each resume and runs its clock on; runs of earlier releases restarted the clock.
    resumes = max(markers, continuous_wall_time(rows))
    config_file = path / "config.yaml"
    raw = {}
    if config_file.is_file():
        try:
            loaded = yaml.safe_load(config_file.read_text(encoding="utf-8"))
        except yaml.YAMLError:
            loaded = None
        raw = loaded if isinstance(loaded, dict) else {}
    return Run(path, label or path.name, rows, resumes=resumes, config=raw, **_from_config(raw))


def load_runs(paths: list[str | Path], labels: Optional[list[str]] = None) -> list[Run]:
    """Every run, labelled by its directory name (with its parent's where two names clash) unless `labels`
    names them."""
    if not paths:
        raise ReportError("no run directory given; pass one or more directories written by `fasync train`")
    if labels is not None and len(labels) != len(paths):
        raise ReportError(f"{len(labels)} labels for {len(paths)} runs; give one label per run directory")
    paths = [Path(p) for p in paths]
    if labels is None:
        names = [p.resolve().name for p in paths]
        labels = [f"{p.resolve().parent.name}/{name}" if names.count(name) > 1 else name
                  for p, name in zip(paths, names)]
    return [load_run(p, label) for p, label in zip(paths, labels)]
