"""Time-to-reward of the quickstart: `fasync train configs/quickstart.yaml`, end to end, N times.

    python bench/time_to_reward.py [--runs N] [--config configs/quickstart.yaml] [--target 0.9]

Reports per run the wall time of the whole command (Ray start included), the run's own time to the
target (metrics `wall_time` at the step where the 3-rollout mean reward first reached it) and the
rollouts it took, and writes the table into docs/training.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from report import ROOT, provenance, table, time_to_reward, train, write_block


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
            code, wall, records = train(args.config, [f"train.seed={seed}", f"data.seed={seed}"],
                                        Path(scratch) / f"run{seed}")
            reached = time_to_reward(records, args.target)
            rollouts = records[-1]["rollout"] + 1 if records else 0
            rows.append([seed, code, round(wall, 1), None if reached is None else round(reached, 1), rollouts])
            print(f"seed {seed}: exit {code}, command {wall:.1f} s, reward {args.target} after "
                  f"{reached if reached is not None else 'never'} s, {rollouts} rollouts", flush=True)
    text = "\n\n".join([
        provenance(f"python bench/time_to_reward.py --runs {args.runs} --config {args.config}"),
        table(["seed", "exit", "command wall (s)", f"run time to {args.target} (s)", "rollouts"], rows),
    ])
    print(text)
    if not args.no_write:
        write_block(ROOT / "docs" / "training.md", "time-to-reward", text)
    return 0 if all(row[1] == 0 and row[3] is not None for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
