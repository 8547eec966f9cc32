"""Long trajectories under the staleness bound: guess the number with up to `--turns` model turns a trajectory,
trained in fully_async with partial rollout under each `async.max_weight_staleness` of `--bounds`, and the table
written into docs/agentic.md.

    python bench/agentic_staleness.py [--bounds 0 1 2 4] [--turns 8] [--rollouts 12] [--no-write]

Per bound: how many trajectories span several weight versions and by how much (`agent/multi_version_fraction`,
`agent/version_span_*`), the largest staleness trained on, the share of generated samples dropped as stale, and
what admission does to the run: samples/s, and the fractions of the steady window the trainer and the engines
spent idle (fasync.metrics.measure). The untrained model rarely finds the number, so most trajectories run all
their turns.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from fasync.bench.modes import run_variant
from fasync.bench.report import measured, table, write_block
from fasync.commands.train import run as train
from fasync.metrics.measure import measure
from fasync.metrics.registry import over

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "agentic" / "guess_number.yaml"


def overrides(bound: int, turns: int, rollouts: int) -> list[str]:
    return ["mode=fully_async", "async.partial_rollout=true", f"async.max_weight_staleness={bound}",
            f"rollout.max_turns={turns}", "model.max_seq_len=128", "rollout.batch_size=8",
            "rollout.n_samples_per_prompt=8", "train.global_batch_size=64", "train.micro_batch_size=64",
            f"train.num_rollouts={rollouts}", "train.target_reward=null", "correction.level=token",
            "logging.progress=none"]


def row(bound: int, code: int, records: list[dict], engines: int) -> list:
    report = measure("fully_async", code, records, 1.0, engines)
    return [bound, int(code), report.rollouts, _rounded(over("agent/turns_mean", records)),
            _rounded(over("agent/multi_version_fraction", records)), _rounded(over("agent/version_span_mean", records)),
            over("agent/version_span_max", records), report.staleness_max, _rounded(report.stale_dropped),
            _rounded(report.samples_per_s), _rounded(report.trainer_idle), _rounded(report.rollouter_idle)]


def _rounded(value):
    return None if value is None else round(value, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bounds", nargs="+", type=int, default=[0, 1, 2, 4])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=12)
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/agentic.md alone.")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for bound in args.bounds:
            code, records, engines = run_variant(train, str(CONFIG), overrides(bound, args.turns, args.rollouts),
                                                 Path(scratch) / f"bound-{bound}")
            rows.append(row(bound, code, records, engines))
            print(rows[-1], flush=True)
    text = "\n\n".join([
        f"{measured(sys.argv)}; loaded: the machine was shared with other sessions, so the times are upper bounds.",
        table(["max_weight_staleness", "exit", "drains", "turns", "multi-version trajectories",
               "versions spanned (mean)", "versions spanned (max)", "staleness max", "dropped stale",
               "samples/s", "trainer idle", "engines idle"], rows),
    ])
    print(text)
    if not args.no_write:
        write_block(ROOT / "docs" / "agentic.md", "agentic-staleness", text, "`python bench/agentic_staleness.py`")
    return 0 if all(r[1] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
