"""Learning quality under staleness, measured like AReaL's Table 2: fully_async runs of the quickstart task
and of a harder built-in task at each bound on staleness η and each off-policy correction, several seeds
per cell.

    python bench/learning_quality.py                  # the full grid: 2 tasks × 5 η × 5 corrections × 3 seeds
    python bench/learning_quality.py --quick          # η ∈ {0, 2, 8}, the quickstart task only
    python bench/learning_quality.py --tasks sort10 --staleness 0 4 --corrections none bypass

Every run is `fasync train configs/fully_async.yaml` with the overrides of its task, its η
(`async.max_weight_staleness`), its correction and its seed, and keeps its run directory
(`--out`, default runs/learning-quality/TASK/CORRECTION/etaN/seedS: config.yaml, metrics.jsonl,
summary.json), so the curves can be plotted from them afterwards. A run directory whose run ended at its
target or budget is read instead of trained again, so an interrupted grid resumes where it stopped (a
run cut short is trained afresh).

Per cell the table gives the fraction of seeds whose 3-drain mean reward reached the task's target within
the drain budget, the median optimizer steps and wall time to it (over the seeds that reached it), the
final reward (mean over seeds of the last 3 drains' mean), the staleness the trained samples actually had,
and the mean `is/ess_token` over every step of every seed. Writes it into docs/correction.md (section
Learning quality) with a plot beside it when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fasync.bench.modes import COMMON
from fasync.bench.report import fmt, measured, table, write_block
from fasync.metrics.measure import REWARD_WINDOW, last_per_rollout

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/fully_async.yaml"
DOC = ROOT / "docs" / "correction.md"
PLOT = ROOT / "docs" / "learning_quality.png"
CURVES = ROOT / "docs" / "learning_quality_curves.png"


@dataclass(frozen=True)
class Task:
    label: str
    overrides: tuple[str, ...]
    target: float


TASKS = {
    "reverse6": Task("reverse, 6 digits (the quickstart)", (), 0.9),
    # Ten sorted digits: each answer is ten tokens whose right values depend on the whole prompt, so one
    # step moves many tokens' probabilities at once and stale samples disagree with the policy more. The
    # tiny model climbs slowly (a sync-like run, η = 0, passes 0.5 after about 120 drains), hence the target.
    "sort10": Task("sort, 10 digits", ("data.task=sort", "data.length=10", "rollout.max_new_tokens=10"), 0.5),
}

CORRECTIONS = {
    "none": ("no correction (proximal anchor, no weights: the plain policy gradient on stale samples)",
             ("correction.ratio_anchor=proximal", "correction.level=none")),
    "decoupled": ("decoupled PPO (proximal anchor, token weights π_prox/π_behav, tokens with a weight above 5 "
                  "masked, as AReaL's weight cap)",
                  ("correction.ratio_anchor=proximal", "correction.level=token", "correction.weight_upper=5.0",
                   "correction.reject_token_ratio=[0.0,5.0]")),
    "bypass": ("bypass (the PPO ratio against the behaviour policy, clipped; no weights)",
               ("correction.ratio_anchor=behaviour", "correction.level=none")),
    "tis": ("token-level truncated IS (proximal anchor, token weights truncated at 2)",
            ("correction.ratio_anchor=proximal", "correction.level=token", "correction.weight_upper=2.0")),
    "rejection": ("rejection (proximal anchor, no weights, tokens whose ratio leaves [0.5, 2] masked)",
                  ("correction.ratio_anchor=proximal", "correction.level=none",
                   "correction.reject_token_ratio=[0.5,2.0]")),
}

STALENESS = (0, 1, 2, 4, 8)
QUICK = {"tasks": ["reverse6"], "staleness": [2, 8]}
"""`--quick`: the quickstart task at the shipped bound (2) and at AReaL's largest (8)."""


@dataclass(frozen=True)
class Run:
    task: str
    correction: str
    staleness: int
    seed: int

    def directory(self, out: Path) -> Path:
        return out / self.task / self.correction / f"eta{self.staleness}" / f"seed{self.seed}"

    def overrides(self, rollouts: int) -> list[str]:
        task = TASKS[self.task]
        return [*COMMON, *task.overrides, *CORRECTIONS[self.correction][1],
                f"async.max_weight_staleness={self.staleness}", f"train.num_rollouts={rollouts}",
                f"train.target_reward={task.target}", f"train.seed={self.seed}", f"data.seed={self.seed}"]


_RAY_HELD = False


def _train(run: Run, out: Path, rollouts: int) -> tuple[Run, int, float]:
    """Train one run in this worker (which keeps one Ray session for all its runs): exit code, seconds."""
    global _RAY_HELD
    import ray

    from fasync.bench.modes import run_variant
    from fasync.commands.train import run as train

    if not _RAY_HELD:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        _RAY_HELD = True
    if run.directory(out).exists():  # a run stopped half-way: start it afresh (metrics.jsonl appends)
        shutil.rmtree(run.directory(out))
    started = time.monotonic()
    code, _, _ = run_variant(train, CONFIG, run.overrides(rollouts), run.directory(out))
    return run, code, time.monotonic() - started


def _records(directory: Path) -> list[dict]:
    from fasync.metrics.writer import read_metrics

    metrics = directory / "metrics.jsonl"
    return read_metrics(metrics) if metrics.exists() else []


def reached_at(records: list[dict], target: float) -> dict | None:
    """The drain record whose last-REWARD_WINDOW mean reward first reached `target`."""
    rewards: list[float] = []
    for record in last_per_rollout(records):
        rewards.append(record["rollout_reward_mean"])
        if len(rewards) >= REWARD_WINDOW and sum(rewards[-REWARD_WINDOW:]) / REWARD_WINDOW >= target:
            return record
    return None


def complete(directory: Path) -> bool:
    """Whether the run in `directory` ended as a run of the grid should: at its target or after its whole
    drain budget (a run stopped from outside also writes a summary.json, with fewer drains)."""
    import yaml

    summary_file, config_file = directory / "summary.json", directory / "config.yaml"
    if not summary_file.is_file() or not config_file.is_file():
        return False
    summary = json.loads(summary_file.read_text())
    budget = (yaml.safe_load(config_file.read_text()) or {}).get("train", {}).get("num_rollouts")
    drains = len(last_per_rollout(_records(directory)))
    return summary.get("outcome") == "finished" and ("target" in str(summary.get("stop_reason"))
                                                      or drains >= (budget or 0))


def cell_row(runs: list[Run], out: Path) -> list | None:
    """One table row from the complete runs of a cell; None when none is."""
    finished = [run for run in runs if complete(run.directory(out))]
    if not finished:
        return None
    target = TASKS[runs[0].task].target
    steps, seconds, finals, ess, staleness = [], [], [], [], []
    for run in finished:
        records = _records(run.directory(out))
        hit = reached_at(records, target)
        if hit is not None:
            steps.append(hit["step"] + 1)
            seconds.append(hit["wall_time"])
        drains = [r["rollout_reward_mean"] for r in last_per_rollout(records)]
        finals.append(sum(drains[-REWARD_WINDOW:]) / max(len(drains[-REWARD_WINDOW:]), 1))
        ess += [r["is/ess_token"] for r in records if r.get("is/ess_token") is not None]
        staleness += [r["staleness_mean"] for r in records if r.get("staleness_mean") is not None]
    return [runs[0].task, runs[0].correction, runs[0].staleness, f"{len(steps)}/{len(finished)}",
            statistics.median(steps) if steps else None, statistics.median(seconds) if seconds else None,
            statistics.mean(finals), statistics.mean(staleness) if staleness else None,
            statistics.mean(ess) if ess else None]


HEADER = ["task", "correction", "η", "reached", "steps to target (median)", "time to target (s, median)",
          "final reward (mean)", "staleness mean", "is/ess_token (mean)"]


def plot(rows: list[list], path: Path) -> bool:
    """Per task, the fraction of seeds reaching the target and the final reward against η, a line per
    correction. False (nothing written) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    tasks = list(dict.fromkeys(row[0] for row in rows))
    figure, axes = plt.subplots(len(tasks), 2, figsize=(10, 3.6 * len(tasks)), squeeze=False)
    for line, task in enumerate(tasks):
        for color, correction in enumerate(CORRECTIONS):
            cell = sorted((row for row in rows if row[0] == task and row[1] == correction), key=lambda r: r[2])
            if not cell:
                continue
            etas = [row[2] for row in cell]
            reached = [int(row[3].split("/")[0]) / int(row[3].split("/")[1]) for row in cell]
            # One colour per correction in every panel of both figures, whichever cells a grid has.
            axes[line][0].plot(etas, reached, marker="o", label=correction, color=f"C{color}")
            axes[line][1].plot(etas, [row[6] for row in cell], marker="o", label=correction, color=f"C{color}")
        axes[line][0].set(title=f"{TASKS[task].label}: seeds reaching {TASKS[task].target}",
                          xlabel="max_weight_staleness η (versions)", ylabel="fraction of seeds", ylim=(-0.05, 1.05))
        axes[line][1].set(title=f"{TASKS[task].label}: final reward", xlabel="max_weight_staleness η (versions)",
                          ylabel="reward (mean of last 3 drains)")
        for axis in axes[line]:
            axis.set_xscale("symlog", linthresh=1)
            axis.set_xticks(sorted({row[2] for row in rows}), labels=[str(e) for e in sorted({row[2] for row in rows})])
            axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    return True


def plot_curves(cells: dict[tuple, list[Run]], out: Path, path: Path) -> bool:
    """Per task and η, the reward per drain (mean over the cell's seeds, 5-drain running mean), a line per
    correction. False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    # A row per task, a column per η: the grid stays readable however many η were run.
    tasks = sorted({task for task, _, _ in cells}, key=list(TASKS).index)
    etas = sorted({eta for _, _, eta in cells})
    figure, axes = plt.subplots(len(tasks), len(etas), figsize=(3.6 * len(etas), 3.0 * len(tasks)), squeeze=False)
    for (row, task), (column, eta) in ((t, e) for t in enumerate(tasks) for e in enumerate(etas)):
        axis = axes[row][column]
        for color, correction in enumerate(CORRECTIONS):
            curves = [[r["rollout_reward_mean"] for r in last_per_rollout(_records(run.directory(out)))]
                      for run in cells.get((task, correction, eta), [])]
            if not curves:
                continue
            mean = [statistics.mean(c[i] for c in curves if i < len(c)) for i in range(max(map(len, curves)))]
            smooth = [statistics.mean(mean[max(0, i - 4):i + 1]) for i in range(len(mean))]
            axis.plot(range(1, len(smooth) + 1), smooth, label=f"{correction} ({len(curves)} seeds)", color=f"C{color}")
        axis.axhline(TASKS[task].target, color="grey", linestyle=":", linewidth=1)
        # A seed that reached the target stopped there: later drains average the seeds still running.
        axis.set(title=f"{task}, η = {eta}", xlabel="drain (optimizer step)",
                 ylabel="reward (5-drain mean over\nthe seeds still running)")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--staleness", nargs="+", type=int, default=list(STALENESS), help="The η values.")
    parser.add_argument("--corrections", nargs="+", choices=list(CORRECTIONS), default=list(CORRECTIONS))
    parser.add_argument("--seeds", type=int, default=3, help="Seeds per cell (train.seed and data.seed 0..N-1).")
    parser.add_argument("--rollouts", type=int, default=200, help="Drain budget per run.")
    parser.add_argument("--quick", action="store_true", help=f"Only {QUICK['tasks']} at η ∈ {QUICK['staleness']}.")
    parser.add_argument("--jobs", type=int, default=1, help="Runs trained at once (one Ray session each).")
    parser.add_argument("--budget-minutes", type=float, default=None,
                        help="Start no run after this many minutes; the table then holds the runs that finished.")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "learning-quality",
                        help="Run directories; finished ones are read, not trained again.")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/correction.md alone.")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.staleness = QUICK["tasks"], QUICK["staleness"]
    if min(args.staleness) < 0 or args.seeds < 1 or args.rollouts < REWARD_WINDOW or args.jobs < 1:
        parser.error("--staleness must be ≥ 0, --seeds and --jobs ≥ 1, --rollouts ≥ 3")

    # Seed-major order: after each pass over the cells every cell has one more seed, so a grid cut short
    # by --budget-minutes is cut evenly.
    grid = [Run(task, correction, eta, seed) for seed in range(args.seeds) for task in args.tasks
            for eta in args.staleness for correction in args.corrections]
    pending = [run for run in grid if not complete(run.directory(args.out))]
    print(f"learning quality: {len(grid)} runs, {len(grid) - len(pending)} already in {args.out}", flush=True)
    started = time.monotonic()
    deadline = None if args.budget_minutes is None else started + 60 * args.budget_minutes
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        running = set()
        for run in pending:
            while len(running) >= args.jobs:
                done = next(iter(_wait(running)))
                running.discard(done)
            if deadline is not None and time.monotonic() > deadline:
                print("learning quality: budget spent, no new runs", flush=True)
                break
            running.add(pool.submit(_train, run, args.out, args.rollouts))
        for _ in _wait(running, every=True):
            pass

    # Every finished run in --out, this invocation's and earlier ones' (same settings: the directory says
    # which), so that a grid run in parts makes one table.
    cells: dict[tuple, list[Run]] = {}
    for summary in sorted(args.out.glob("*/*/eta*/seed*/summary.json")):
        seed_dir = summary.parent
        task, correction = seed_dir.parent.parent.parent.name, seed_dir.parent.parent.name
        if task in TASKS and correction in CORRECTIONS and complete(seed_dir):
            run = Run(task, correction, int(seed_dir.parent.name[3:]), int(seed_dir.name[4:]))
            cells.setdefault((run.task, run.correction, run.staleness), []).append(run)
    rows = [row for runs in cells.values() if (row := cell_row(runs, args.out)) is not None]
    rows.sort(key=lambda r: (list(TASKS).index(r[0]), r[2], list(CORRECTIONS).index(r[1])))
    (args.out / "cells.json").write_text(json.dumps({"header": HEADER, "rows": rows}, indent=1))
    runs_done = sum(int(row[3].split("/")[1]) for row in rows)
    settings = "\n".join(
        [f"- task `{name}`: {task.label}, target {task.target}, overrides `{' '.join(task.overrides) or '(none)'}`"
         for name, task in TASKS.items() if any(row[0] == name for row in rows)]
        + [f"- `{name}`: {label}: `{' '.join(overrides)}`" for name, (label, overrides) in CORRECTIONS.items()
           if any(row[1] == name for row in rows)])
    plotted = plot(rows, PLOT) if not args.no_write else False
    curved = plot_curves(cells, args.out, CURVES) if not args.no_write else False
    text = "\n\n".join([
        f"{measured(sys.argv)}. {runs_done} runs of `fasync train {CONFIG}` with `{' '.join(COMMON)}`, "
        f"`async.max_weight_staleness=η`, `train.num_rollouts={args.rollouts}` (drains; one optimizer step each), "
        "seeds 0, 1, 2, ... (`train.seed`, `data.seed`; the reached column counts the runs of a cell), stopping when the 3-drain mean reward reaches "
        "the task's target. Steps and time to target are medians over the seeds that reached it; final reward "
        "and staleness are means over seeds (of the last 3 drains, of every step); `is/ess_token` is the mean "
        "over every step of every seed.",
        settings,
        table(HEADER, [[*row[:4], fmt(row[4], 0), fmt(row[5], 1), *row[6:]] for row in rows]),
        *(["![Fraction of seeds reaching the target and final reward against η](learning_quality.png)"]
          if plotted else []),
        *(["![Reward per drain for each correction, one panel per task and η](learning_quality_curves.png)"]
          if curved else []),
    ])
    print(text)
    if not args.no_write:
        write_block(DOC, "learning-quality", text, "`python bench/learning_quality.py`")
    return 0


def _wait(futures: set, every: bool = False):
    """Futures as they finish (all of them with `every`, else the first), printing each run's outcome."""
    from concurrent.futures import FIRST_COMPLETED, wait

    remaining = set(futures)
    while remaining:
        done, remaining = wait(remaining, return_when=FIRST_COMPLETED)
        for future in done:
            run, code, seconds = future.result()
            print(f"learning quality: {run.task} {run.correction} η={run.staleness} seed {run.seed}: exit {code}, "
                  f"{seconds:.0f} s", flush=True)
            yield future
        if not every:
            return


if __name__ == "__main__":
    sys.exit(main())
