"""Evidence for off-policy correction: the fully_async quickstart (max_weight_staleness 2) with the
decoupled objective, next to the same run without correction, and what the `is/` metrics showed.

    python bench/correction_evidence.py [--rollouts 400]

Writes the table into docs/correction.md (section Evidence).
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

CONFIG = "configs/fully_async.yaml"
VARIANTS = {
    "decoupled PPO: proximal anchor, token weights ≤ 2": ["correction.ratio_anchor=proximal",
                                                         "correction.level=token", "correction.weight_upper=2.0"],
    "no correction: proximal anchor, no weights": ["correction.ratio_anchor=proximal", "correction.level=none"],
    "bypass: ratio against the behaviour policy, clipped (as shipped)": [],
}
METRICS = ("staleness_mean", "is/kl_k3", "is/log_ppl_diff", "is/chi2_token", "is/ess_token", "is/ess_seq",
           "is/truncated_token_frac", "clip_fraction")


def mean(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=400, help="Drain budget per run.")
    parser.add_argument("--seeds", type=int, default=2, help="Runs per variant (train.seed and data.seed 0..N-1).")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/correction.md alone.")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, (name, overrides) in enumerate(VARIANTS.items()):
            runs = []
            for seed in range(args.seeds):
                code, records, _ = run_variant(train, CONFIG, [*overrides, f"train.num_rollouts={args.rollouts}",
                                                        f"train.seed={seed}", f"data.seed={seed}",
                                                        "logging.progress=none"],
                                               Path(scratch) / f"variant{index}-seed{seed}")
                runs.append((code, time_to_target(records, 0.9), len(last_per_rollout(records)), records))
                print(name, seed, runs[-1][:3], flush=True)
            reached = [run[1] for run in runs]
            rows.append([
                name,
                max(run[0] for run in runs),
                f"{sum(r is not None for r in reached)}/{len(runs)}",
                sum(run[2] for run in runs) / len(runs),
                None if None in reached else sum(reached) / len(reached),
                max((r["staleness_max"] for run in runs for r in run[3]), default=None),
                *[mean([r for run in runs for r in run[3]], key) for key in METRICS],
            ])
    header = ["run", "worst exit", "reached 0.9", "drains (mean)", "time to 0.9 (s, mean)", "staleness max",
              *METRICS]
    text = "\n\n".join([
        f"{measured(sys.argv)}. Each run is `fasync train {CONFIG}` with the overrides its name describes and"
        f" seeds 0..{args.seeds - 1}, stopping at a 3-drain mean reward of 0.9 or after {args.rollouts} drains;"
        " drains and time are means over seeds, metric columns means over every step of every seed.",
        table(header, rows),
    ])
    print(text)
    if not args.no_write:
        write_block(ROOT / "docs" / "correction.md", "correction-evidence", text,
                    "`python bench/correction_evidence.py`")
    return 0 if rows[0][1] == 0 and rows[0][4] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
