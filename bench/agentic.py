"""The agentic examples learning: each example environment trained in sync, async and fully_async on the embedded
model, and the table written into docs/agentic.md.

    python bench/agentic.py [--examples guess_number lookup] [--modes sync async fully_async] [--seeds 1]
                            [--no-write]

Per run: its exit code, the rollouts it took, the mean reward of its last 3 rollouts against the config's
`train.target_reward` and the run time to reach it (`fasync report` charts the run directories it leaves); the
trajectories' mean turns, tool calls and masked token fraction; and, in the async modes, the share of trajectories
whose trained tokens span several weight versions, the most versions one spans, the largest staleness trained on and
the groups dropped as stale.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from fasync.bench.modes import run_variant
from fasync.bench.report import measured, table, write_block
from fasync.metrics.measure import last_per_rollout, time_to_target
from fasync.metrics.registry import over

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "agentic"
MODE_OVERRIDES = {
    "sync": ["mode=sync"],
    "async": ["mode=async", "async.max_weight_staleness=1"],
    "fully_async": ["mode=fully_async", "async.max_weight_staleness=2", "async.partial_rollout=true"],
}


def target_of(config: Path) -> float:
    import yaml

    return float(yaml.safe_load(config.read_text())["train"]["target_reward"])


def row(example: str, mode: str, seed: int, code: int, records: list[dict], target: float) -> list:
    rollouts = last_per_rollout(records)
    last = [r["rollout_reward_mean"] for r in rollouts[-3:]]
    reached = time_to_target(records, target)
    return [example, mode, seed, code, len(rollouts), round(sum(last) / max(len(last), 1), 3),
            "never" if reached is None else round(reached),
            _rounded(over("agent/turns_mean", records)), _rounded(over("agent/tool_calls", records)),
            _rounded(over("agent/masked_token_fraction", records)),
            _rounded(over("agent/multi_version_fraction", records)), over("agent/version_span_max", records),
            over("staleness_max", records), over("dropped_stale", records) if mode == "fully_async" else "-"]


def _rounded(value):
    return None if value is None else round(value, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", nargs="+", default=["guess_number", "lookup"])
    parser.add_argument("--modes", nargs="+", default=list(MODE_OVERRIDES), choices=list(MODE_OVERRIDES))
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/agentic.md alone.")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for example in args.examples:
            config = EXAMPLES / f"{example}.yaml"
            for mode in args.modes:
                for seed in range(args.seeds):
                    overrides = [*MODE_OVERRIDES[mode], f"train.seed={seed}", f"data.seed={seed}",
                                 "logging.progress=none"]
                    code, records, _ = run_variant(str(config), overrides, Path(scratch) / f"{example}-{mode}-{seed}")
                    rows.append(row(example, mode, seed, code, records, target_of(config)))
                    print(rows[-1], flush=True)
    text = "\n\n".join([
        f"{measured(sys.argv)}; seed N sets `train.seed` and `data.seed`.",
        table(["example", "mode", "seed", "exit", "rollouts", "reward (last 3)", "run time to target (s)",
               "turns", "tool calls", "masked tokens", "multi-version trajectories", "most versions spanned",
               "staleness max", "dropped stale"], rows),
    ])
    print(text)
    if not args.no_write:
        write_block(ROOT / "docs" / "agentic.md", "agentic", text, "`python bench/agentic.py`")
    return 0 if all(r[3] == 0 and r[6] != "never" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
