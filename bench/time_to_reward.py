"""Time-to-reward of the quickstart: `fasync train configs/quickstart.yaml`, N times with different seeds.

    python bench/time_to_reward.py [--runs N] [--config configs/quickstart.yaml] [--target 0.9]

Reports per run the wall time of the whole training call (Ray start and shutdown included), the run's
own time to the target (metrics `wall_time` at the rollout where the 3-rollout mean reward first
reached it) and the rollouts it took, and writes the table into docs/training.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from fasync.bench.modes import run_variant
from fasync.bench.report import measured, table, write_block
from fasync.commands.train import run as train
from fasync.metrics.measure import last_per_rollout, time_to_target

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/training.md alone.")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for seed in range(args.runs):
            started = time.monotonic()
            code, records, _ = run_variant(train, args.config, [f"train.seed={seed}", f"data.seed={seed}",
                                                         "logging.progress=none"], Path(scratch) / f"run{seed}")
            wall = time.monotonic() - started
            reached = time_to_target(records, args.target)
            rows.append([seed, code, round(wall, 1), None if reached is None else round(reached, 1),
                         len(last_per_rollout(records))])
            print(f"seed {seed}: exit {code}, {wall:.1f} s in all, reward {args.target} at "
                  f"{'never' if reached is None else f'{reached:.1f} s'}, {rows[-1][-1]} rollouts", flush=True)
    text = "\n\n".join([
        f"{measured(sys.argv)}; seed N sets `train.seed` and `data.seed`.",
        table(["seed", "exit", "wall, Ray start included (s)", f"run time to {args.target} (s)", "rollouts"], rows),
    ])
    print(text)
    if not args.no_write:
        write_block(ROOT / "docs" / "training.md", "time-to-reward", text, "`python bench/time_to_reward.py`")
    return 0 if all(row[1] == 0 and row[3] is not None for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
