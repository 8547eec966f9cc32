"""What evaluation during training costs in each mode: the quickstart's mode configs run a fixed number of
rollouts without evaluation and with it (`eval.held_out_prompts`, `eval.every`), and the table compares their
wall times with the time the evaluations took.

    python bench/eval_cost.py [--rollouts 12] [--every 2] [--held-out 64] [--no-write]

In sync an evaluation holds training for its whole length; in async and fully_async it runs beside the
rollouts, and the added wall time shows how much of it training still waited for (the engines are shared:
eval generation takes turns with the rollouts'). Writes the table into docs/training.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from fasync.bench.modes import run_variant
from fasync.bench.report import measured, table, write_block
from fasync.metrics.registry import over

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"sync": "configs/quickstart.yaml", "async": "configs/async.yaml", "fully_async": "configs/fully_async.yaml"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=12)
    parser.add_argument("--every", type=int, default=4, help="eval.every, in optimizer steps (one per rollout).")
    # 256 prompts × 8 samples: each evaluation generates what 8 rollouts of 32 × 8 do, so that its cost stands
    # out of the noise of a shared machine (a few seconds between two runs of the same config).
    parser.add_argument("--held-out", type=int, default=256, help="eval.held_out_prompts.")
    parser.add_argument("--samples", type=int, default=8, help="eval.samples_per_prompt.")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/training.md alone.")
    args = parser.parse_args()

    common = [f"train.num_rollouts={args.rollouts}", "train.target_reward=null", "logging.progress=none",
              f"eval.held_out_prompts={args.held_out}"]
    evaluating = [f"eval.every={args.every}", f"eval.samples_per_prompt={args.samples}"]
    rows, codes = [], []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        for mode, config in CONFIGS.items():
            walls, waits = {}, {}
            for label, extra in (("without", []), ("with", evaluating)):
                code, records, _ = run_variant(str(ROOT / config), common + extra, Path(scratch) / f"{mode}-{label}")
                codes.append(code)
                walls[label] = records[-1]["wall_time"] if code == 0 and records else None
                waits[label] = over("trainer_wait_s", records) if mode != "sync" else None
                if label == "with":
                    evaluations = [r for r in records if "eval/time_s" in r]
                    eval_time = over("eval/time_s", records)
            if None in walls.values():  # a run failed (its own message is above): no figures to compare
                rows.append([mode, "failed", *[None] * 6])
                continue
            added = walls["with"] - walls["without"]
            rows.append([mode, len(evaluations), round(walls["without"], 1), round(walls["with"], 1),
                         round(added, 1), round(eval_time, 1), round(added / eval_time, 2) if eval_time else None,
                         "—" if mode == "sync" else f"{waits['without']:.1f} / {waits['with']:.1f}"])
            print(rows[-1], flush=True)
    load = (load_before + os.getloadavg()[0]) / 2
    text = "\n\n".join([
        f"{measured(sys.argv)}. **Loaded**: other sessions shared the machine (load average about {load:.0f} on "
        f"{os.cpu_count()} cores), so the seconds are slower and noisier than on a quiet machine; compare the "
        f"modes' ratios rather than the seconds. Each run: {args.rollouts} rollouts of the mode's config "
        f"(`{' '.join(common)}`), with evaluation `{' '.join(evaluating)}` or without.",
        table(["mode", "evaluations", "wall without eval (s)", "wall with eval (s)", "added (s)",
               "eval time, summed (s)", "added / eval time", "trainer waited for rollouts, without / with (s)"],
              rows),
    ])
    print(text)
    if not args.no_write:
        write_block(ROOT / "docs" / "training.md", "eval-cost", text, "`python bench/eval_cost.py`")
    return 0 if all(code == 0 for code in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
