"""The kill-point matrix (issue 32): for each mode, `fasync train` is SIGKILLed at one of fasync's own kill points
(fasync/killpoints.py) on its n-th pass, with its whole process group, as if its machine died; `fasync train
--resume` then runs it to its end, and `fasync ledger` must pass on the run directory.

    python scripts/kill_matrix.py                          # the whole matrix (`make test-kill`)
    python scripts/kill_matrix.py --mode fully_async       # one mode's cases
    python scripts/kill_matrix.py --sample 1 --seed 7      # 1 case per mode, chosen by seed 7 (CI's rotation)
    python scripts/kill_matrix.py --list                   # the cases, without running them

A case is a list of kills, one per process: ("checkpoint_rename:4",) kills the first process at its fourth
rename of a checkpoint into place; ("checkpoint_saved:1", "ray_start:1") kills the first process after its first
checkpoint and the resumed one as its Ray cluster started. After the last kill, one more `--resume` without a kill
must finish the run. A kill that lands before the run's first checkpoint leaves nothing to resume: `--resume` must
say so (exit 1), the journal must still pass `fasync ledger`, and the case counts apart ("before a checkpoint").
A kill point passed fewer than n times does not kill: the run must finish and pass the ledger ("not reached").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
NUM_ROLLOUTS = 6
EVERY = 4
"""Two optimizer steps a rollout: checkpoints at steps 4, 8 and 12, and the final one replaces the one of step 12
(`checkpoint.keep: 1`), which is the fourth rename into place."""

BASE = {
    "model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 16},
    "data": {"task": "reverse", "length": 3},
    "reward": {"function": "partial_match"},
    "rollout": {"batch_size": 4, "n_samples_per_prompt": 4, "max_new_tokens": 4},
    "train": {"global_batch_size": 8, "micro_batch_size": 4, "num_rollouts": NUM_ROLLOUTS, "lr": 3e-3,
              "target_reward": None},
    "checkpoint": {"every": EVERY, "keep": 1},
    "logging": {"progress": "none"},
}
"""A run that trains in seconds on one CPU: a one-layer model reversing three digits."""

MODE_SECTIONS = {
    "sync": {},
    "async": {"async": {"max_weight_staleness": 1}, "correction": {"level": "token"}},
    # One token per engine call, so that kills and checkpoints find groups part-way through their generation.
    "fully_async": {"async": {"max_weight_staleness": 2, "partial_rollout": True, "tokens_per_call": 1},
                    "correction": {"level": "token"}},
}

COMMON_KILLS = [
    "rollout_end:3", "rollout_end:5", "journal_append:3", "journal_append:8", "checkpoint_temp:1",
    "checkpoint_temp:3", "checkpoint_rename:1", "checkpoint_rename:4", "checkpoint_saved:2", "weight_sync:3",
    "weight_sync:5", "engine_generate:4", "engine_load:4", "engine_load:6", "trainer_step:6",
    "trainer_step:9",
]
"""Kills every mode passes through, on passes chosen to land around and after the first checkpoint."""
MODE_KILLS = {
    # One generate call a rollout: the sixth is the last rollout's.
    "sync": ["engine_generate:6"],
    "async": ["engine_generate:6"],
    # A generate call a token (`tokens_per_call: 1`): many more passes.
    "fully_async": ["prefetch:3", "prefetch:5", "rollouter_snapshot:2", "rollouter_snapshot:3",
                    "engine_generate:9", "engine_generate:20", "engine_generate:30"],
}
CHAINS = [("checkpoint_saved:1", "ray_start:1"), ("checkpoint_saved:1", "checkpoint_saved:1")]
"""Kills of a resumed process: at its Ray start, and at its first checkpoint."""
SEEDS = (0, 1)


@dataclass(frozen=True)
class Case:
    mode: str
    kills: tuple[str, ...]
    seed: int

    @property
    def name(self) -> str:
        return f"{self.mode}-{'-'.join(kill.replace(':', '_') for kill in self.kills)}-seed{self.seed}"


def cases(modes=tuple(MODE_SECTIONS)) -> list[Case]:
    """The whole matrix: every mode's kills × seeds."""
    return [Case(mode, kills, seed) for mode in modes
            for kills in [(kill,) for kill in COMMON_KILLS + MODE_KILLS[mode]] + CHAINS for seed in SEEDS]


def sample(modes, per_mode: int, seed: int) -> list[Case]:
    """`per_mode` cases of each mode, chosen by `seed`: each mode's alike whichever modes are asked for, so that
    `--mode MODE --sample N --seed SEED` repeats one mode of a sample."""
    return [case for mode in modes for case in random.Random(f"{seed}:{mode}").sample(cases((mode,)), per_mode)]


def _config(case: Case, directory: Path) -> Path:
    raw = json.loads(json.dumps(BASE))
    for section, values in MODE_SECTIONS[case.mode].items():
        raw.setdefault(section, {}).update(values)
    raw["mode"] = case.mode
    raw["train"]["seed"] = case.seed
    path = directory / f"{case.name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _fasync(args: list[str], kill: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`fasync ARGS` in a session of its own (a kill takes its whole group, and only it)."""
    env = {key: value for key, value in os.environ.items() if key not in ("FASYNC_KILL_AT", "FASYNC_KILL_GROUP")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    if kill is not None:
        env["FASYNC_KILL_AT"] = kill
    process = subprocess.Popen([sys.executable, "-m", "fasync.cli", *args], cwd=REPO, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        output = ""
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever of the session is left (nothing, normally)
        except ProcessLookupError:
            pass
    process.wait()
    return subprocess.CompletedProcess(args, process.returncode, output, "")


def _has_checkpoint(run_dir: Path) -> bool:
    from fasync import checkpoint

    try:
        return checkpoint.latest(run_dir) is not None
    except checkpoint.CheckpointError:
        return True  # a broken newest one: the resume must say so, which the case then checks


@dataclass
class Result:
    case: Case
    verdict: str
    """"held", "before a checkpoint", "not reached", or "FAILED: why"."""
    seconds: float

    @property
    def held(self) -> bool:
        return not self.verdict.startswith("FAILED")


def run_case(case: Case, root: Path) -> Result:
    """Run `case` in `root`; its verdict."""
    start = time.monotonic()
    verdict = _verdict(case, root)
    return Result(case, verdict, time.monotonic() - start)


def _verdict(case: Case, root: Path) -> str:
    run_dir = root / case.name
    config = _config(case, root)
    for index, kill in enumerate(case.kills):
        args = ["train", str(config), "--run-dir", str(run_dir)] if index == 0 else ["train", "--resume", str(run_dir)]
        result = _fasync(args, kill)
        if result.returncode != -signal.SIGKILL:
            if result.returncode == 0 and index == len(case.kills) - 1:
                return _finished(run_dir, "not reached")
            return f"FAILED: process {index + 1} exited {result.returncode} instead of being killed at {kill}:\n" \
                   f"{result.stdout[-3000:]}"
        if not _has_checkpoint(run_dir):
            resumed = _fasync(["train", "--resume", str(run_dir)])
            if resumed.returncode != 1 or "holds no checkpoint to resume from" not in resumed.stdout:
                return f"FAILED: killed before a checkpoint, the resume exited {resumed.returncode}:\n" \
                       f"{resumed.stdout[-3000:]}"
            return _ledger(run_dir, "before a checkpoint", ended=False)
    resumed = _fasync(["train", "--resume", str(run_dir)])
    if resumed.returncode != 0:
        return f"FAILED: the resume exited {resumed.returncode}:\n{resumed.stdout[-3000:]}"
    return _finished(run_dir, "held")


def _finished(run_dir: Path, verdict: str) -> str:
    """The run reached its end, and its ledger passes."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as error:
        return f"FAILED: no summary after the resume ({error})"
    expected = NUM_ROLLOUTS * BASE["rollout"]["batch_size"] * BASE["rollout"]["n_samples_per_prompt"] \
        // BASE["train"]["global_batch_size"]
    if summary.get("outcome") != "finished" or summary.get("optimizer_steps") != expected:
        return f"FAILED: the run ended {summary.get('outcome')} after {summary.get('optimizer_steps')} optimizer " \
               f"steps, not finished after {expected}"
    return _ledger(run_dir, verdict, ended=True)


def _ledger(run_dir: Path, verdict: str, ended: bool) -> str:
    audit = _fasync(["ledger", str(run_dir)], timeout=120)
    if audit.returncode != 0:
        return f"FAILED: fasync ledger exited {audit.returncode}:\n{audit.stdout[-3000:]}"
    if ended and "ended cleanly" not in audit.stdout:
        return f"FAILED: the ledger does not show a clean end:\n{audit.stdout[-3000:]}"
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", action="append", choices=list(MODE_SECTIONS), help="only this mode (repeatable)")
    parser.add_argument("--sample", type=int, help="this many cases per mode, chosen by --seed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="print the cases and run nothing")
    parser.add_argument("--keep", action="store_true", help="keep the run directories (printed at the end)")
    args = parser.parse_args(argv)
    modes = tuple(args.mode or MODE_SECTIONS)
    chosen = sample(modes, args.sample, args.seed) if args.sample else cases(modes)
    if args.list:
        print("\n".join(case.name for case in chosen))
        return 0
    root = Path(tempfile.mkdtemp(prefix="fasync-kill-"))
    print(f"kill matrix: {len(chosen)} cases in {root}" + (f" (seed {args.seed})" if args.sample else ""), flush=True)
    started = time.monotonic()
    results = []
    for case in chosen:
        result = run_case(case, root)
        results.append(result)
        print(f"  {case.name}: {result.verdict.splitlines()[0]} ({result.seconds:.0f} s)", flush=True)
        if not result.held:
            print("    " + "\n    ".join(result.verdict.splitlines()[1:]), flush=True)
    failed = [r for r in results if not r.held]
    tally = {verdict: sum(r.verdict == verdict for r in results) for verdict in
             ("held", "before a checkpoint", "not reached")}
    print(f"kill matrix: {len(results) - len(failed)}/{len(results)} held ({', '.join(f'{k} {v}' for k, v in tally.items())}"
          f", failed {len(failed)}) in {time.monotonic() - started:.0f} s")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
