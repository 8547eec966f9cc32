"""Runs of the `fasync` command line as a user makes them: a tiny config written to a directory, and the CLI run
in a subprocess from the repository."""

from __future__ import annotations

import os
import subprocess
import sys
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
