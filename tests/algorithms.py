"""The algorithms the learning tests train, beside grpo's defaults: every estimator, aggregation, ratio and the
epochs with a schedule (docs/algorithms.md). Each learning run takes about half a minute on two quiet cores, so
`make test` (and CI) trains a rotating one per mode, chosen by a seed from FASYNC_ALGORITHM_SEED or else the day,
which covers them all within a week; `make test-algorithms` trains every one."""

import datetime
import os

import pytest

ALGORITHMS = {
    "rloo": {"advantage_estimator": "rloo"},
    "reinforce_plus_plus": {"advantage_estimator": "reinforce_plus_plus"},
    "reinforce_plus_plus_baseline": {"advantage_estimator": "reinforce_plus_plus_baseline"},
    "dr_grpo": {"loss_aggregation": "seq_mean_token_sum_norm", "normalize_advantage_std": False},
    "gspo": {"importance_ratio": "sequence"},
    "epochs_schedule": {"ppo_epochs": 2, "lr_warmup_steps": 5, "lr_schedule": "cosine"},
}
"""Name → the `train` section's keys that select it."""


def learning_params(offset: int) -> list:
    """One pytest param per algorithm (its `train` keys), all but the rotation's pick skipped unless
    FASYNC_ALL_ALGORITHMS is set; `offset` moves the pick, so that two modes train different ones on a day."""
    seed = int(os.environ.get("FASYNC_ALGORITHM_SEED") or datetime.date.today().toordinal())
    names = list(ALGORITHMS)
    picked = names[(seed + offset) % len(names)]
    everything = bool(os.environ.get("FASYNC_ALL_ALGORITHMS"))
    skip = pytest.mark.skip(reason=f"rotating sample (FASYNC_ALGORITHM_SEED={seed} picks {picked}): "
                                   "`make test-algorithms` trains every one")
    return [pytest.param(train, id=name, marks=() if everything or name == picked else skip)
            for name, train in ALGORITHMS.items()]
