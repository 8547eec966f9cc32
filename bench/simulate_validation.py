"""`fasync simulate` against reality, and how fast it is; writes the generated blocks of docs/simulate.md.

    python bench/simulate_validation.py [--repeat N] [--out DIR] [--no-runs] [--no-write]

1. Speed: a 1,000-step simulation of each mode, and a 50-point sweep, timed (median of three).
2. The worked examples: `fasync simulate` on configs/simulate/7b-8gpu.yaml and on the long-tail reasoning
   config with its sweep.
3. Validation (skipped with --no-runs): the `fasync bench` scenarios (the quickstart in three modes, then the
   long tail in all its variants) run for real; the cost model is calibrated from the quickstart's first
   sync run alone, every variant is predicted from it, and predicted and measured figures are compared
   against the goals of docs/simulate.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fasync.bench.modes import (
    COMMON,
    LONG_TAIL,
    Scenario,
    ScenarioResult,
    run_scenario,
    standard_scenario,
    variant_overrides,
)
from fasync.bench.report import measured, parallel_capacity, table, write_block
from fasync.commands.train import run as train
from fasync.modes import MODES

ROOT = Path(__file__).resolve().parent.parent

DOC = ROOT / "docs" / "simulate.md"
QUICKSTART = "configs/quickstart.yaml"
WRITER = "`python bench/simulate_validation.py`"
GOALS = {"samples_per_s": 0.20, "staleness_mean": 0.25, "stale_dropped": 0.03}


def _timed(action, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def speed_block() -> str:
    from fasync.commands.simulate import build_report
    from fasync.config.loader import load_config
    from fasync.simulate.costs import Costs
    from fasync.simulate.lengths import build_lengths
    from fasync.simulate.predict import simulate

    rows = []
    for mode in MODES:
        cfg = load_config(ROOT / QUICKSTART, [f"mode={mode}", "train.num_rollouts=1000"]).config
        seconds = _timed(lambda cfg=cfg: simulate(cfg, Costs(), build_lengths(cfg)))
        rows.append([f"1,000 optimizer steps, {mode} (256 samples each)", f"{seconds:.3f}"])
    sweep = ["--sweep", "async.max_weight_staleness=0,1,2,4,8", "--sweep", "async.tokens_per_call=2,4,6,12,24",
             "--sweep", "mode=async,fully_async"]
    overrides = ["async.partial_rollout=true", "rollout.max_new_tokens=24", "train.num_rollouts=100"]
    sweeps = [sweep[i + 1] for i in range(0, len(sweep), 2)]
    seconds = _timed(lambda: build_report(str(ROOT / QUICKSTART), overrides, [], sweeps), repeats=1)
    rows.append([f"a 50-point sweep (`{' '.join(sweep)}`, 100 steps each, plus the sync reference), "
                 "config loading included", f"{seconds:.2f}"])
    load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    return "\n\n".join([f"{measured(sys.argv)}; load average {load}.",
                        table(["what", "seconds (median of 3; the sweep: once)"], rows)])


def example_blocks() -> dict[str, str]:
    from fasync.commands.simulate import build_report, render_text

    examples = {
        "example-7b": ("configs/simulate/7b-8gpu.yaml",
                       ["async.max_weight_staleness=1,2", "async.partial_rollout=true,false", "mode=async,fully_async"]),
        "example-long-tail": ("configs/simulate/long-tail-reasoning.yaml",
                              ["async.tokens_per_call=512,2048,8192", "async.max_weight_staleness=1,2,4"]),
    }
    blocks = {}
    for name, (config, sweeps) in examples.items():
        report = build_report(config, [], [], sweeps)
        command = f"fasync simulate {config} " + " ".join(f"--sweep {s}" for s in sweeps)
        blocks[name] = f"```\n$ {command}\n{render_text(report)}\n```"
    return blocks


# -- validation --------------------------------------------------------------------------------------


def _run_overrides(scenario: Scenario, variant, target: float) -> list[str]:
    return [*COMMON, f"train.target_reward={target}", *variant_overrides(scenario, variant, ROOT / "configs")]


def predict_scenario(result: ScenarioResult, costs) -> list:
    """Each variant predicted with `costs`, over as many rollouts as its real run trained."""
    from fasync.config.loader import load_config
    from fasync.simulate.lengths import build_lengths
    from fasync.simulate.predict import simulate

    predictions = []
    for variant, report in zip(result.scenario.variants, result.reports):
        overrides = [*_run_overrides(result.scenario, variant, result.target),
                     f"train.num_rollouts={max(report.rollouts, 2)}"]
        cfg = load_config(ROOT / QUICKSTART, overrides).config
        predictions.append(simulate(cfg, costs, build_lengths(cfg)))
    return predictions


def _error(predicted: float, real: float) -> float:
    return (predicted - real) / real if real else float("inf")


def validation_table(result: ScenarioResult, predictions: list) -> tuple[str, list[dict]]:
    rows, verdicts = [], []
    for variant, real, predicted in zip(result.scenario.variants, result.reports, predictions):
        runs = real.runs_samples_per_s
        error = _error(predicted.samples_per_s, real.samples_per_s)
        verdict = {
            "label": variant.label,
            "samples": abs(error) <= GOALS["samples_per_s"],
            "staleness": abs(predicted.staleness_mean - real.staleness_mean) <= GOALS["staleness_mean"],
            "dropped": abs(predicted.stale_dropped - real.stale_dropped) <= GOALS["stale_dropped"],
        }
        verdicts.append(verdict)
        rows.append([
            variant.label,
            f"{predicted.samples_per_s:.0f}",
            f"{real.samples_per_s:.0f} ({'–'.join(f'{v:.0f}' for v in (min(runs), max(runs)))})"
            if len(runs) > 1 else f"{real.samples_per_s:.0f}",
            f"{error:+.0%} ({'yes' if verdict['samples'] else 'no'})",
            f"{predicted.staleness_mean:.2f} / {real.staleness_mean:.2f} ({'yes' if verdict['staleness'] else 'no'})",
            f"{predicted.stale_dropped:.1%} / {real.stale_dropped:.1%} ({'yes' if verdict['dropped'] else 'no'})",
            f"{predicted.trainer_idle:.2f} / {real.trainer_idle:.2f}",
            f"{predicted.rollouter_idle:.2f} / {real.rollouter_idle:.2f}",
        ])
    header = ["variant", "predicted samples/s", "measured (runs)", "error (≤ 20%)", "staleness mean, pred / meas "
              "(± 0.25)", "dropped as stale, pred / meas (± 3 pts)", "trainer idle, pred / meas",
              "rollouter idle, pred / meas"]
    return table(header, rows), verdicts


def ranking(result: ScenarioResult, predictions: list) -> str:
    """Pairs of variants whose measured gap exceeds the run-to-run spread: does the prediction order them
    the same way?"""
    reports = result.reports
    labels = [v.label for v in result.scenario.variants]
    if all(len(r.runs_samples_per_s) < 2 for r in reports):
        return "Ranking by samples/s: not checked, one run per variant gives no run-to-run spread."
    spread = [max(r.runs_samples_per_s) - min(r.runs_samples_per_s) for r in reports]
    checked, agreed, misses = 0, 0, []
    for i in range(len(reports)):
        for j in range(i + 1, len(reports)):
            gap = reports[i].samples_per_s - reports[j].samples_per_s
            if abs(gap) <= max(spread[i], spread[j]):
                continue
            checked += 1
            if (predictions[i].samples_per_s - predictions[j].samples_per_s) * gap > 0:
                agreed += 1
            else:
                misses.append(f"{labels[i]} against {labels[j]}")
    text = f"Ranking by samples/s: {agreed} of {checked} pairs whose measured gap exceeds both runs' spread " \
           "are ordered as measured"
    return text + (f"; misordered: {'; '.join(misses)}." if misses else ".")


def phases_line(calibration) -> str:
    measured_phases, simulated = calibration.measured[0], calibration.simulated[0]
    return (f"Calibration run (the quickstart's first sync run, {measured_phases.rollouts} rollouts after the "
            f"first): generate {measured_phases.generate * 1000:.1f} ms, optimizer steps "
            f"{measured_phases.steps * 1000:.1f} ms, train call {measured_phases.call * 1000:.1f} ms, weight sync "
            f"{(measured_phases.sync or 0) * 1000:.1f} ms per rollout; default costs replayed the same run at "
            f"{simulated.generate * 1000:.1f}, {simulated.steps * 1000:.1f}, {simulated.call * 1000:.1f} and "
            f"{(simulated.sync or 0) * 1000:.1f} ms. Fitted costs (`simulate.costs`): "
            + ", ".join(f"{k} {v:g}" for k, v in calibration.costs.to_config().items() if v is not None) + ".")


def kept_scenario(scenario: Scenario, out: Path, target: float) -> tuple[ScenarioResult, int] | None:
    """A scenario measured from the run directories an earlier invocation kept (`--from`), every repeat of
    each variant (medians, as `run_scenario` takes them), and the fewest repeats a variant has; None unless
    every variant has one."""
    from fasync.bench.modes import read_run_dir
    from fasync.metrics.measure import measure, median_report

    reports, repeats = [], []
    measured_at = scenario.target if scenario.target is not None else target
    for index, variant in enumerate(scenario.variants):
        run_dirs = sorted(out.glob(f"{scenario.name}/{index}-{variant.mode}-*/summary.json"))
        if not run_dirs:
            return None
        runs = []
        for summary in run_dirs:
            records, engines = read_run_dir(summary.parent)
            runs.append(measure(variant.mode, 0, records, measured_at, engines))
        reports.append(median_report(runs))
        repeats.append(len(runs))
    return ScenarioResult(scenario, measured_at, reports), min(repeats)


def validation_block(out: Path, repeats: int, kept: bool = False) -> str:
    from fasync.simulate.calibrate import calibrate

    load_before = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    capacity = parallel_capacity()
    dataset = LONG_TAIL.write_dataset(out / "long-tail.jsonl") if not kept else out / "long-tail.jsonl"
    scenarios = [standard_scenario(), LONG_TAIL.scenario(dataset)]
    if kept:
        found = [found for found in (kept_scenario(s, out, 0.9) for s in scenarios) if found is not None]
        results = [result for result, _ in found]
        repeats = min((count for _, count in found), default=0)
    else:
        results = [run_scenario(train, s, QUICKSTART, [], out, 0.9, ROOT / "configs", repeats) for s in scenarios]
    calibration = calibrate([out / "modes" / "0-sync-0"])
    load_after = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    parts = [
        f"{measured(sys.argv)}. Load average {load_before} before the runs and {load_after} after; two busy "
        f"processes got {capacity:.2f} cores' worth of work done at once (2.00 on two free cores). Each variant "
        f"ran {repeats}× (in turn with the others); measured figures are medians, with the runs' range.",
        phases_line(calibration),
    ]
    if kept:
        parts[0] = (f"{measured(sys.argv)}: measured from the run directories a run of this script kept, "
                    f"{repeats} or more per variant (medians, with the runs' range); the load while they ran is "
                    "not known here (it was measured as that run's block says), and the load average now is "
                    f"{load_after}.")
    verdicts = []
    for result in results:
        predictions = predict_scenario(result, calibration.costs)
        text, scenario_verdicts = validation_table(result, predictions)
        verdicts += scenario_verdicts
        parts += [f"**{result.scenario.name}**", text, ranking(result, predictions)]
    met = {goal: sum(v[goal] for v in verdicts) for goal in ("samples", "staleness", "dropped")}
    parts.append(f"Goals met: samples/s within 20% for {met['samples']} of {len(verdicts)} variants, staleness "
                 f"mean within 0.25 versions for {met['staleness']}, fraction dropped as stale within 3 points "
                 f"for {met['dropped']}.")
    return "\n\n".join(parts)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="real runs per variant (default 2)")
    parser.add_argument("--out", help="keep the runs' directories here (default: a temporary directory)")
    parser.add_argument("--no-runs", action="store_true", help="only the speed and the worked examples")
    parser.add_argument("--from", dest="kept", help="measure the run directories an earlier --out kept instead of "
                        "running (scenarios whose runs all finished)")
    parser.add_argument("--no-write", action="store_true", help="print the blocks; leave docs/simulate.md alone")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    blocks = {"simulate-speed": speed_block(), **{f"simulate-{k}": v for k, v in example_blocks().items()}}
    if args.kept:
        blocks["simulate-validation"] = validation_block(Path(args.kept), 0, kept=True)
    elif not args.no_runs:
        with tempfile.TemporaryDirectory(prefix="fasync-simulate-") as scratch:
            blocks["simulate-validation"] = validation_block(Path(args.out or scratch), args.repeat)
    for name, text in blocks.items():
        print(f"--- {name}\n{text}\n", flush=True)
        if not args.no_write:
            write_block(DOC, name, text, writer=WRITER)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
