"""Every algorithm of docs/algorithms.md on the quickstart, in sync and fully_async.

    python bench/algorithms.py [--rollouts N] [--modes sync fully_async] [--no-write]

Trains configs/quickstart.yaml (fully_async: configs/fully_async.yaml) once per algorithm with its settings as
overrides, and writes a table of the mean reward of the first and last 10 rollouts and the time to the quickstart's
target into docs/algorithms.md. `--rollouts` shortens every run (the quickstart allows 400).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from fasync.bench.modes import run_variant
from fasync.bench.report import measured, table, write_block
from fasync.commands.train import run as train
from fasync.metrics.measure import last_per_rollout, time_to_target

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"sync": "configs/quickstart.yaml", "fully_async": "configs/fully_async.yaml"}
TARGET = 0.9
"""The quickstart's `train.target_reward`."""
ALGORITHMS = {
    "grpo": [],
    "rloo": ["train.advantage_estimator=rloo"],
    "reinforce_plus_plus": ["train.advantage_estimator=reinforce_plus_plus"],
    "reinforce_plus_plus_baseline": ["train.advantage_estimator=reinforce_plus_plus_baseline"],
    "Dr. GRPO": ["train.loss_aggregation=seq_mean_token_sum_norm", "train.normalize_advantage_std=false"],
    "GSPO": ["train.importance_ratio=sequence"],
    "2 PPO epochs, cosine, warmup 10": ["train.ppo_epochs=2", "train.lr_schedule=cosine", "train.lr_warmup_steps=10"],
    # The quickstart's budget is the answer's width; two more tokens leave room for the stop token and the buffer.
    "budget 8, overlong buffer 1": ["rollout.max_new_tokens=8", "reward.overlong_buffer=1"],
}
"""Each algorithm's overrides of the mode's config."""


def mean(values: list[float]) -> float:
    return round(sum(values) / max(len(values), 1), 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=None, help="Rollouts per run (default: the config's).")
    parser.add_argument("--modes", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/algorithms.md alone.")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for mode in args.modes:
            for name, overrides in ALGORITHMS.items():
                length = [f"train.num_rollouts={args.rollouts}"] if args.rollouts else []
                code, records, _ = run_variant(train, CONFIGS[mode], [*overrides, *length, "logging.progress=none"],
                                               Path(scratch) / f"{mode}-{len(rows)}")
                rewards = [record["reward_mean"] for record in last_per_rollout(records)]
                reached = time_to_target(records, TARGET)
                rows.append([mode, name, code, len(rewards), mean(rewards[:10]), mean(rewards[-10:]),
                             None if reached is None else round(reached, 1)])
                print(rows[-1], flush=True)
    text = "\n\n".join([
        f"{measured(sys.argv)}; one seed per cell, so differences of a few hundredths are noise.",
        table(["mode", "algorithm", "exit", "rollouts", "reward, first 10", "reward, last 10",
               f"time to {TARGET} (s)"], rows),
    ])
    print(text)
    if not args.no_write:
        write_block(ROOT / "docs" / "algorithms.md", "algorithms", text, "`python bench/algorithms.py`")
    return 0 if all(row[2] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
