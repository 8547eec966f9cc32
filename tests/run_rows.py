"""Run directories written as a run writes them, for the commands that read them (report, bench)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from fasync.metrics.registry import check_row


def step_rows(mode: str, rollouts: int = 6, steps_per_rollout: int = 2, staleness: int = 1,
              reward_start: float = 0.1) -> list[dict]:
    """Metrics rows as the drivers write them: every key registered for `mode`."""
    rows = []
    for rollout in range(rollouts):
        for index in range(steps_per_rollout):
            step = rollout * steps_per_rollout + index
            row = {
                "step": step, "rollout": rollout, "weight_version": rollout, "wall_time": 2.0 + rollout + 0.4 * index,
                "loss": 0.1, "num_samples": 16, "num_tokens": 64, "reward_mean": reward_start + 0.1 * rollout,
                "rollout_reward_mean": reward_start + 0.1 * rollout, "generate_time_s": 0.3 if index == 0 else 0.0,
                "train_time_s": 0.2, "train_call_time_s": 0.25, "weight_sync_time_s": 0.05 if index else 0.0,
                "staleness_mean": 0.5 * min(rollout, staleness), "staleness_max": min(rollout, staleness),
                "policy_lag_max": min(rollout, staleness) * steps_per_rollout + index,
                "is/kl_k3": 0.01 * (rollout + 1), "is/ess_token": 0.9, "is/chi2_token": 0.1,
                "is/truncated_token_frac": 0.02,
            }
            if mode != "sync":
                row["trainer_wait_s"] = 0.1
            if mode == "fully_async":
                row["queue_size"] = rollout % 3
            if index == steps_per_rollout - 1:  # an evaluation after every rollout, on its last row
                row.update({"eval/weight_version": rollout + 1, "eval/pass@k": min(1.0, 0.2 + 0.1 * rollout),
                            "eval/mean@k": 0.1 + 0.05 * rollout, "eval/reward_mean": 0.15 + 0.05 * rollout})
            check_row(row, mode)
            rows.append(row)
    return rows


def write_run(directory: Path, rows: list[dict], config: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if config is not None:
        (directory / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return directory
