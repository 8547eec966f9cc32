"""Runs of the `fasync` command line as a user makes them: a tiny config written to a directory, and the CLI run
in a subprocess from the repository."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from paths import REPO
from sections import tiny_sections, with_sections

RUN_SECTIONS = {
    "model": {"d_model": 64, "n_heads": 4},
    "data": {"length": 2},
    "rollout": {"batch_size": 16, "n_samples_per_prompt": 8, "max_new_tokens": 2},
    "train": {"global_batch_size": 128, "micro_batch_size": 64, "num_rollouts": 60, "lr": 5e-3},
}
"""What these runs change from the tiny run: a wider model and bigger batches on two-digit reversal, so that
the reward rises within 60 rollouts."""


def write_config(directory: Path, name: str = "run.yaml", **sections) -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(with_sections(tiny_sections(**RUN_SECTIONS), **sections), sort_keys=False))
    return path


def fasync(*args: str, cwd: Path = REPO, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "fasync.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


MODES = {
    "sync": {},
    "async": {"async": {"max_weight_staleness": 1}, "correction": {"level": "token"}},
    "fully_async": {"async": {"max_weight_staleness": 2, "partial_rollout": True},
                    "correction": {"level": "token"}},
}


def start_train(config: Path | None, out: Path | None, *extra: str) -> subprocess.Popen:
    """`fasync train [extra] [CONFIG --run-dir OUT]` in its own session, so that killing the session's processes
    kills the run and the Ray cluster it started."""
    run = [*([str(config), "--run-dir", str(out)] if config else [])]
    return subprocess.Popen([sys.executable, "-m", "fasync.cli", "train", *extra, *run], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def newest_checkpoint(out: Path) -> int:
    """The step of the run's newest checkpoint; -1 when it has none."""
    found = sorted((out / "checkpoints").glob("step-*")) if (out / "checkpoints").is_dir() else []
    return max((int(path.name.split("-")[1]) for path in found), default=-1)


def kill_after_a_checkpoint(process: subprocess.Popen, out: Path, steps_after: int = 1) -> int:
    """SIGKILL the run `start_train` started (its whole session: the driver and its Ray processes) once it has a
    checkpoint after a step and `steps_after` step rows past it; returns the newest checkpoint's step."""
    from fasync.metrics.writer import read_metrics

    deadline = time.monotonic() + 240
    try:
        while True:
            assert process.poll() is None, f"the run ended before it was killed:\n{process.stdout.read()}"
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            step = newest_checkpoint(out)
            rows = len(read_metrics(out / "metrics.jsonl")) if (out / "metrics.jsonl").exists() else 0
            if step >= 1 and rows >= step + steps_after:
                break
            time.sleep(0.05)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.communicate()
    return newest_checkpoint(out)
