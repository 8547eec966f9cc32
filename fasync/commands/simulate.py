"""`fasync simulate CONFIG [KEY=VALUE...] [--calibrate RUN_DIR]... [--sweep KEY=V1,V2,...]...`

Without a sweep: the config in each of the three modes (its own `async` settings), against sync. With
sweeps: every point of the grid in the config's mode (or in each mode the `mode` sweep names), against
sync, with the Pareto front of samples/s against mean staleness marked.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import typer

from fasync.errors import ConfigurationError
from fasync.exit_codes import ExitCode
from fasync.modes import MODES
from fasync.simulate.costs import Costs
from fasync.simulate.predict import Prediction


@dataclass
class Report:
    config: str
    costs: Costs
    lengths: str
    sweep_keys: list[str]
    predictions: list[Prediction]
    reference: Prediction
    pareto: list[bool] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "config": self.config,
            "costs": {"source": self.costs.source, **self.costs.to_config()},
            "lengths": self.lengths,
            "sweep_keys": self.sweep_keys,
            "reference": self.reference.as_dict(),
            "variants": [{**p.as_dict(), "pareto": front} for p, front in zip(self.predictions, self.pareto)],
        }


def parse_sweep(text: str) -> tuple[str, list[str]]:
    key, sep, values = text.partition("=")
    items = [value.strip() for value in values.split(",") if value.strip()]
    if not sep or not key.strip() or not items:
        raise ConfigurationError(f"--sweep {text!r}: write KEY=V1,V2,... (e.g. async.max_weight_staleness=1,2,4)")
    return key.strip(), items


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """Which (speed, staleness) points no other point beats on both: as fast or faster and as fresh or fresher,
    strictly better on one."""
    return [not any(s >= speed and t <= stale and (s > speed or t < stale) for s, t in points)
            for speed, stale in points]


def _load(config: str, overrides: list[str]):
    from fasync.config.loader import load_config
    from fasync.diagnostics import Severity

    loaded = load_config(config, overrides)
    if loaded.config is None:
        errors = [d for d in loaded.diagnostics if d.severity is Severity.ERROR]
        where = f"{errors[0].location.file}:{errors[0].location.line}: " if errors and errors[0].location else ""
        first = errors[0] if errors else None
        raise ConfigurationError(f"{where}{first.code}: {first.message}" + (f" ({first.help})" if first.help else "")
                                 if first else "the config does not load")
    return loaded.config


def build_report(config: str, overrides: list[str], calibrate: list[str], sweeps: list[str]) -> Report:
    from fasync.simulate.calibrate import calibrate as fit
    from fasync.simulate.costs import Costs
    from fasync.simulate.lengths import build_lengths
    from fasync.simulate.predict import simulate

    base = _load(config, overrides)
    calibration = fit([Path(p) for p in calibrate]) if calibrate else None
    costs = Costs.from_config(base.simulate.costs, calibration.costs if calibration else None)
    run_lengths = calibration.lengths if calibration else None

    def predict(extra: list[str]) -> Prediction:
        cfg = _load(config, [*overrides, *extra])
        prediction = simulate(cfg, costs, build_lengths(cfg, run_lengths))
        prediction.settings = dict(item.split("=", 1) for item in extra)
        return prediction

    grid = [parse_sweep(text) for text in sweeps]
    keys = [key for key, _ in grid]
    if len(set(keys)) != len(keys):
        raise ConfigurationError(f"--sweep: a key is swept twice ({', '.join(keys)})")
    if grid:
        points = [[f"{key}={value}" for key, value in zip(keys, values)]
                  for values in itertools.product(*(values for _, values in grid))]
    else:
        keys = ["mode"]
        points = [[f"mode={mode}"] for mode in MODES]
    reference = predict(["mode=sync"])
    predictions = [reference if point == ["mode=sync"] else predict(point) for point in points]
    for prediction in predictions:
        prediction.speedup = prediction.samples_per_s / reference.samples_per_s if reference.samples_per_s else None
    report = Report(config, costs, build_lengths(base, run_lengths).source, keys, predictions, reference)
    report.pareto = pareto_front([(p.samples_per_s, p.staleness_mean) for p in predictions])
    return report


def _rate(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _pct(value: float) -> str:
    return f"{value:.0%}" if value >= 0.01 or value == 0 else f"{value:.1%}"


def render_text(report: Report) -> str:
    ref = report.reference
    lines = [
        f"fasync simulate {report.config}: {ref.rollouts} rollouts ({ref.optimizer_steps} optimizer steps) per variant",
        f"  costs: {report.costs.source}",
        f"  as simulate.costs: {json.dumps(report.costs.to_config())}",
        f"  lengths: {report.lengths}",
        "",
    ]
    header = [*report.sweep_keys, "samples/s", "× sync", "trainer idle", "rollouter idle", "staleness mean/max",
              "lag steps mean/max (bound)", "queue mean/max", "dropped stale", f"time to {ref.optimizer_steps} steps"]
    if len(report.predictions) > 1 and report.sweep_keys != ["mode"]:
        header.append("pareto")
    rows = []
    for prediction, front in zip(report.predictions, report.pareto):
        bound = "∞" if prediction.lag_bound_steps is None else prediction.lag_bound_steps
        row = [*(prediction.settings.get(key, "") for key in report.sweep_keys),
               _rate(prediction.samples_per_s), f"{prediction.speedup:.2f}" if prediction.speedup else "-",
               _pct(prediction.trainer_idle), _pct(prediction.rollouter_idle),
               f"{prediction.staleness_mean:.2f}/{prediction.staleness_max}",
               f"{prediction.lag_mean_steps:.2f}/{prediction.lag_max_steps} ({bound})",
               f"{prediction.queue_mean:.1f}/{prediction.queue_max}", _pct(prediction.stale_dropped),
               f"{prediction.time_to_steps_s:.1f} s"]
        if "pareto" in header:
            row.append("*" if front else "")
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    lines.append("")
    for prediction in report.predictions:
        label = ", ".join(f"{k}={v}" for k, v in prediction.settings.items()) or prediction.mode
        histogram = " ".join(f"{k}:{v}" for k, v in prediction.staleness_histogram.items())
        by_length = " ".join(f"{k} tokens {_pct(v)}" for k, v in prediction.stale_dropped_by_length.items())
        ledger = "balanced" if prediction.ledger_balanced else "UNBALANCED"
        lines.append(f"{label}: staleness (versions: samples) {histogram}; dropped as stale by completion "
                     f"length: {by_length}; ledger {ledger}")
    if "pareto" in header:
        lines.append("\n* on the Pareto front of samples/s against mean staleness: no other point is both faster "
                     "and fresher.")
    return "\n".join(lines)


def run(config: str, overrides: list[str], calibrate: list[str], sweeps: list[str], fmt: str) -> int:
    """Print the report; 2 with a one-line message on stderr for a bad config, run directory or sweep."""
    code, output = _report_or_error(config, overrides, calibrate, sweeps, fmt)
    typer.echo(output, err=code != 0)
    return code


def _report_or_error(config: str, overrides: list[str], calibrate: list[str], sweeps: list[str],
                     fmt: str) -> tuple[ExitCode, str]:
    if not Path(config).is_file():
        return ExitCode.USAGE, f"fasync simulate: {config}: no such config file"
    try:
        report = build_report(config, overrides, calibrate, sweeps)
    except ConfigurationError as error:
        return ExitCode.USAGE, f"fasync simulate: {error}"
    return ExitCode.OK, json.dumps(report.as_dict(), indent=2) if fmt == "json" else render_text(report)
