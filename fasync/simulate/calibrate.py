"""Fitting the cost model to real runs (`fasync simulate CONFIG --calibrate RUN_DIR`).

A run directory holds the resolved config (`config.yaml`) and one metrics record per optimizer step
(`metrics.jsonl`) with the phase times the drivers measure: `generate_time_s` (sync, async: the rollout's
generation; fully_async: engine time since the previous drain), `train_time_s` (the optimizer steps),
`train_call_time_s` (the whole train call) and `weight_sync_time_s` (what the sync held the driver).

The run is replayed in simulated time with the current costs, on its own config and mode (with the share of
completions at `rollout.max_new_tokens` its mean lengths imply, `simulate.learning: run`), and each phase
is scaled to match its measured mean per rollout (the first rollout, which includes start-up, left out of
both):

- generation: every engine cost by (measured / simulated generation). Runs whose calls differ in how much
  work each carries (a sync run makes one call per rollout and engine; a fully_async run with sliced calls
  many short ones) also tell the fixed cost of a call from the rest: the call's cost and one scale for the
  others are then fitted to all of them at once (least squares, replayed until the calls settle);
- the optimizer steps: every per-step, per-micro-batch and per-token cost by (measured / simulated steps);
- the train call's fixed cost: what the call takes beyond its steps, less the `recompute` anchor's forward;
- the weight sync (sync runs only, where the driver waits for it): its fixed cost.

Runs of several shapes pool their phase totals. Apart from the generate call's fixed cost, a phase's internal
split (fixed against per-token costs) stays the one the costs started from: one run of one shape cannot tell
them apart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from fasync.errors import ConfigurationError
from fasync.simulate.costs import Costs

ENGINE_FIELDS = ("engine_call", "engine_prefill_token", "engine_step", "engine_row")
SPLIT_ITERATIONS = 4
"""Replays of the call-cost fit: a cheaper or dearer call changes how many calls a fully_async run makes."""
DISTINCT_SHAPES = 0.02
"""How far from proportional (1 − cos² of the runs' (calls, rest) vectors) the runs' calls must be to fit the
call's cost on its own."""
STEP_FIELDS = ("trainer_step", "trainer_micro_batch", "trainer_token")


@dataclass
class Phases:
    """Mean seconds per rollout of each phase, and how many rollouts they average."""

    generate: float = 0.0
    steps: float = 0.0
    call: float = 0.0
    sync: Optional[float] = None
    rollouts: int = 0
    calls: float = 1.0
    """Generate calls per rollout whose fixed cost `generate` includes (simulated runs only): one per rollout
    in sync and async, whose engines' calls run side by side; every engine's calls in fully_async."""


@dataclass
class Calibration:
    costs: Costs
    measured: list[Phases]
    simulated: list[Phases]
    lengths: list[float]
    """`response_length_mean` of each optimizer step, in step order (averaged over the runs that reached it):
    `simulate.lengths: run` and `simulate.learning: run`."""


def read_run(run_dir: Path) -> tuple[object, list[dict]]:
    """The run's resolved config and its metrics records; a clear error for anything missing."""
    from fasync.atomic import DamagedFileError
    from fasync.config.loader import load_config
    from fasync.metrics.writer import read_metrics

    run_dir = Path(run_dir)
    config, metrics = run_dir / "config.yaml", run_dir / "metrics.jsonl"
    for path in (config, metrics):
        if not path.is_file():
            raise ConfigurationError(f"--calibrate {run_dir}: no {path.name} (a run directory of `fasync train` "
                                     "holds config.yaml and metrics.jsonl)")
    loaded = load_config(config)
    if loaded.config is None:
        raise ConfigurationError(f"--calibrate {run_dir}: its config.yaml does not load "
                                 f"({loaded.diagnostics[0].message})")
    try:
        records = read_metrics(metrics)
    except DamagedFileError as error:
        raise ConfigurationError(f"--calibrate: {error}") from None
    return loaded.config, records


def measured_phases(mode: str, records: list[dict]) -> Phases:
    by_rollout: dict[int, list[dict]] = {}
    for record in records:
        by_rollout.setdefault(record["rollout"], []).append(record)
    rollouts = [steps for index, steps in sorted(by_rollout.items())][1:]
    if not rollouts:
        raise ConfigurationError("--calibrate: the run has fewer than two rollouts; nothing to fit after start-up")

    def mean(key: str) -> float:
        return sum(sum(r.get(key) or 0.0 for r in steps) for steps in rollouts) / len(rollouts)

    syncs = [sum(r.get("weight_sync_time_s") or 0.0 for r in steps) for steps in rollouts]
    return Phases(generate=mean("generate_time_s"), steps=mean("train_time_s"), call=mean("train_call_time_s"),
                  sync=sum(syncs) / len(syncs) if mode == "sync" else None, rollouts=len(rollouts))


def simulated_phases(cfg, costs: Costs, lengths) -> Phases:
    from fasync.config.derived import derive
    from fasync.simulate.costs import weight_bytes
    from fasync.simulate.drivers import Simulation
    from fasync.simulate.lengths import planning_tokenizer

    simulation = Simulation(cfg, derive(cfg), costs, lengths,
                            weight_bytes(cfg, planning_tokenizer(cfg).vocab_size))
    recorder = simulation.run()
    # As `measured_phases` reads a run: the rollouts after the first.
    rollouts = len(recorder.records) - 1
    calls = 1.0
    if cfg.mode == "fully_async":
        first = recorder.records[0][0]
        later = [end - start for busy in recorder.engine_busy for start, end in busy if end > first]
        generate, calls = sum(later) / rollouts, len(later) / rollouts
    else:
        generate = sum(recorder.generate_s[1:]) / rollouts
    held = recorder.sync_held_s[1:]
    return Phases(generate=generate, steps=sum(s for _, s in recorder.train_calls[1:]) / rollouts,
                  call=sum(c for c, _ in recorder.train_calls[1:]) / rollouts,
                  sync=sum(held) / len(held) if held else None, rollouts=rollouts, calls=calls)


def fit_call_cost(replay, measured: list[Phases], costs: Costs, scale: float) -> Optional[tuple[float, float]]:
    """The generate call's fixed cost and one scale for the other engine costs that make the replays take the
    measured generation times, or None where the runs cannot tell the call from the rest (one shape).

    `replay(costs)` gives each run's simulated phases. Each run's generation is `call × calls + scale × rest`;
    the runs give one such equation each, solved by least squares, and replayed with the result until the
    calls a fully_async run makes settle."""
    call = costs.engine_call * scale
    for _ in range(SPLIT_ITERATIONS):
        trial = replace(costs, engine_call=call, **{name: getattr(costs, name) * scale for name in ENGINE_FIELDS[1:]})
        rows = [(phases.calls, (phases.generate - call * phases.calls) / scale) for phases in replay(trial)]
        nn = sum(n * n for n, _ in rows)
        rr = sum(r * r for _, r in rows)
        nr = sum(n * r for n, r in rows)
        det = nn * rr - nr * nr
        if len(rows) < 2 or nn <= 0 or rr <= 0 or det <= DISTINCT_SHAPES * nn * rr:
            return None
        nm = sum(n * m.generate for (n, _), m in zip(rows, measured))
        rm = sum(r * m.generate for (_, r), m in zip(rows, measured))
        call, scale = (rr * nm - nr * rm) / det, (nn * rm - nr * nm) / det
        if call < 0 or scale <= 0:
            return None
    return call, scale


def calibrate(run_dirs: list[Path], start: Optional[Costs] = None) -> Calibration:
    """Costs that make the runs' replays take the times the runs measured."""
    from fasync.simulate.lengths import build_lengths

    costs = start or Costs()
    runs = []
    for run_dir in run_dirs:
        cfg, records = read_run(run_dir)
        step_lengths = [r["response_length_mean"] for r in records if r.get("response_length_mean")]
        # The replay covers the rollouts the run trained, at the lengths its own config names, run to the limit
        # as often as the run's own mean lengths say (a run still learning to stop generates far more).
        update = {"train": cfg.train.model_copy(update={"num_rollouts": max(2, len({r["rollout"] for r in records}))})}
        if step_lengths and cfg.simulate.lengths != "run":
            update["simulate"] = cfg.simulate.model_copy(update={"learning": "run"})
        cfg = cfg.model_copy(update=update)
        runs.append((cfg, measured_phases(cfg.mode, records), step_lengths))
    by_step = [run_lengths for _, _, run_lengths in runs]
    lengths = [sum(values) / len(values) for values in
               ([run[step] for run in by_step if step < len(run)] for step in range(max(map(len, by_step))))]
    simulated = [simulated_phases(cfg, costs, build_lengths(cfg, run_lengths)) for cfg, _, run_lengths in runs]
    measured = [phases for _, phases, _ in runs]

    def ratio(real: float, model: float) -> float:
        return real / model if model > 0 else 1.0

    engine = ratio(sum(m.generate for m in measured), sum(s.generate for s in simulated))
    steps = ratio(sum(m.steps for m in measured), sum(s.steps for s in simulated))
    updates = {name: getattr(costs, name) * engine for name in ENGINE_FIELDS}
    updates.update({name: getattr(costs, name) * steps for name in STEP_FIELDS})
    # Beyond its steps a train call holds its fixed cost and, under `recompute`, the anchor's forward pass.
    extra = [(m.call - m.steps) - ((s.call - s.steps - costs.trainer_call) * steps)
             for m, s in zip(measured, simulated)]
    updates["trainer_call"] = max(0.0, sum(extra) / len(extra))
    held = [(m.sync, s.sync) for m, s in zip(measured, simulated) if m.sync is not None and s.sync is not None]
    if held:
        fixed = sum(m - (s - costs.weight_sync) for m, s in held) / len(held)
        updates["weight_sync"] = max(0.0, fixed)
    # The call's own cost, where the runs' shapes tell it apart: replayed with the trainer and syncs as fitted,
    # which decide when a fully_async engine's calls start.
    fitted_rest = replace(costs, **{name: value for name, value in updates.items() if name not in ENGINE_FIELDS})
    split = fit_call_cost(lambda trial: [simulated_phases(cfg, trial, build_lengths(cfg, run_lengths))
                                         for cfg, _, run_lengths in runs], measured, fitted_rest, engine)
    if split is not None:
        call, scale = split
        updates.update({name: getattr(costs, name) * scale for name in ENGINE_FIELDS[1:]}, engine_call=call)
    names = ", ".join(str(path) for path in run_dirs)
    fitted = replace(costs, **updates, source=f"calibrated from {names}")
    return Calibration(fitted, measured, simulated, lengths)
