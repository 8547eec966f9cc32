"""The agentic examples learning: each example environment trained in sync, async and fully_async on the embedded
model, the table and the curves (`fasync report`) written into docs/agentic.md and docs/agentic/.

    python bench/agentic.py [--examples guess_number lookup] [--modes sync async fully_async] [--seeds 1]
                            [--out DIR [--reuse]] [--no-write]

With `--out DIR --reuse`, a run whose directory in DIR already holds its result (`bench.json`, written after each
run) is read instead of trained again: several invocations with `--no-write` (one per example, side by side) and a
last one with `--reuse` write one table.

Each run stops when the mean reward of its last rollouts reaches the config's `train.target_reward` (or after
`train.num_rollouts`). Per run: its exit code, the rollouts it took, the mean reward of its last 3 rollouts and the
run time to the target; the trajectories' mean turns, tool calls and masked token fraction; and the weight versions
one trajectory's trained tokens span (the share of trajectories spanning several, the most one spans), the largest
staleness trained on against the mode's bound (`async.max_weight_staleness`, which holds per trained token: a
trajectory is as stale as its oldest trained token) and, in fully_async, the groups dropped as stale. The curves are
those of each example's first seed in every mode.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from fasync.bench.modes import COMMON, read_run_dir, run_variant
from fasync.bench.report import fmt, measured, parallel_capacity, table, write_block
from fasync.commands.train import run as train
from fasync.metrics.measure import last_per_rollout, time_to_target
from fasync.metrics.registry import over

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "agentic"
DOC = ROOT / "docs" / "agentic.md"
CHARTS = ROOT / "docs" / "agentic"
STALENESS_BOUND = {"sync": 0, "async": 1, "fully_async": 2}
"""`async.max_weight_staleness` of each mode's runs (sync trains on the weights that generated)."""
MODE_OVERRIDES = {
    "sync": ["mode=sync"],
    "async": ["mode=async", f"async.max_weight_staleness={STALENESS_BOUND['async']}"],
    "fully_async": ["mode=fully_async", f"async.max_weight_staleness={STALENESS_BOUND['fully_async']}",
                    "async.partial_rollout=true"],
}
SHOWN_CHARTS = ("reward", "agentic", "staleness")


def target_of(config: Path) -> float:
    import yaml

    return float(yaml.safe_load(config.read_text())["train"]["target_reward"])


def row(example: str, mode: str, seed: int, code: int, records: list[dict], target: float) -> list:
    rollouts = last_per_rollout(records)
    last = [r["rollout_reward_mean"] for r in rollouts[-3:]]
    reached = time_to_target(records, target)
    return [example, mode, seed, int(code), len(rollouts), round(sum(last) / max(len(last), 1), 3),
            "never" if reached is None else round(reached),
            _rounded(over("agent/turns_mean", records)), _rounded(over("agent/tool_calls", records)),
            _rounded(over("agent/masked_token_fraction", records)),
            _rounded(over("agent/multi_version_fraction", records)), over("agent/version_span_max", records),
            f"{over('staleness_max', records)} ≤ {STALENESS_BOUND[mode]}",
            over("dropped_stale", records) if mode == "fully_async" else "-"]


def _rounded(value):
    return None if value is None else round(value, 2)


def train_or_reuse(config: Path, overrides: list[str], run_dir: Path, reuse: bool, load: str) -> tuple[int, list[dict], str]:
    """Train the run into `run_dir` and record its exit code and the machine's `load` there, or (`reuse`) read the
    run it already holds: its exit code, step records and the load it ran under."""
    result = run_dir / "bench.json"
    if reuse and result.is_file():
        kept = json.loads(result.read_text())
        return kept["exit"], read_run_dir(run_dir)[0], kept["load"]
    code, records, _ = run_variant(train, str(config), overrides, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)  # a run that failed before starting made none
    result.write_text(json.dumps({"exit": int(code), "overrides": overrides, "load": load}))
    return code, records, load


def curves(example: str, run_dirs: dict[str, Path], load: str) -> str:
    """`fasync report`'s charts of one example's runs (one per mode) in docs/agentic/<example>/, as markdown."""
    from fasync.report import write_report

    directory = CHARTS / example
    title = f"{example}: one run per mode (measured on a shared, loaded machine: {load})"
    report = write_report(list(run_dirs.values()), directory, labels=list(run_dirs), title=title, show_paths=False)
    link = os.path.relpath(directory, DOC.parent)
    lines = [f"**{example}** ([its report]({link}/{report.name}), `fasync report`; on a loaded machine, so wall "
             "times are slower and noisier than on a free one):", ""]
    lines += [f"![{example} {name}]({link}/{name}.png)" for name in SHOWN_CHARTS]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", nargs="+", default=["guess_number", "lookup"])
    parser.add_argument("--modes", nargs="+", default=list(MODE_OVERRIDES), choices=list(MODE_OVERRIDES))
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--out", type=Path, help="Keep the run directories here (default: a temporary directory).")
    parser.add_argument("--reuse", action="store_true", help="Read the runs --out already holds instead of training.")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/ alone.")
    args = parser.parse_args()

    here = (f"load average {' / '.join(f'{value:.2f}' for value in os.getloadavg())} before the runs, two busy "
            f"processes got {fmt(parallel_capacity(), 2)} cores' worth of work done at once, 2.00 on two free cores")
    loads = []
    provenance = measured(sys.argv)
    rows, figures = [], []
    with tempfile.TemporaryDirectory(prefix="fasync-agentic-") as scratch:
        out = args.out or Path(scratch)
        for example in args.examples:
            config = EXAMPLES / f"{example}.yaml"
            first_runs = {}
            for mode in args.modes:
                for seed in range(args.seeds):
                    run_dir = out / f"{example}-{mode}-{seed}"
                    overrides = [*MODE_OVERRIDES[mode], *COMMON, f"train.seed={seed}", f"data.seed={seed}"]
                    code, records, load = train_or_reuse(config, overrides, run_dir, args.reuse, here)
                    loads.append(load)
                    rows.append(row(example, mode, seed, code, records, target_of(config)))
                    print(rows[-1], flush=True)
                    if records and mode not in first_runs:
                        first_runs[mode] = run_dir
            if first_runs and not args.no_write:
                figures.append(curves(example, first_runs, loads[-1]))
    text = "\n\n".join([
        f"{provenance}; seed N sets `train.seed` and `data.seed`. The machine was shared with other work and "
        f"loaded ({'; '.join(dict.fromkeys(loads))}): run times are slower and noisier than on a free machine.",
        table(["example", "mode", "seed", "exit", "rollouts", "reward (last 3)", "run time to target (s)",
               "turns", "tool calls", "masked tokens", "multi-version trajectories", "most versions spanned",
               "staleness max ≤ bound", "dropped stale"], rows),
        *figures,
    ])
    print(text)
    if not args.no_write:
        write_block(DOC, "agentic", text, "`python bench/agentic.py`")
    return 0 if all(r[3] == 0 and r[6] != "never" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
