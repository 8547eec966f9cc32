"""Two data-parallel trainer ranks (Ray actors, gloo) against one rank on the same rollout."""

import random

import pytest
import ray
import torch

from fasync.config.schema import FasyncConfig
from fasync.launch.actors import TrainerGroup
from fasync.launch.plan import resolve
from fasync.rollout.types import GroupId, Sample
from fasync.train.trainer import Trainer

torch.set_num_threads(1)

SETTINGS = {
    "model": {"n_layers": 1, "d_model": 32, "n_heads": 4, "max_seq_len": 16},
    "data": {"task": "reverse", "length": 3},
    "rollout": {"batch_size": 4, "n_samples_per_prompt": 4, "max_new_tokens": 3},
    # Two steps of 8: each rank takes 4 samples a step, in 2 micro batches of 2.
    "train": {"global_batch_size": 8, "micro_batch_size": 2, "num_steps_per_rollout": 2, "lr": 1e-2,
              "kl_coef": 0.05, "entropy_coef": 0.01},
    # Token-level weights from made-up behaviour logprobs: the correction path runs on every rank too.
    "correction": {"level": "token", "weight_upper": 1.5},
}
COMPARED = ["loss", "pg_loss", "kl", "entropy", "clip_fraction", "grad_norm", "num_tokens", "num_samples",
            "is/kl_k3", "is/weight_mean", "is/weight_max", "is/truncated_token_frac"]


def rollout(seed: int) -> list[Sample]:
    """Sixteen completions of 1 to 3 tokens (so ranks hold different token counts), four per group."""
    rng = random.Random(seed)
    samples = []
    for index in range(16):
        length = rng.randint(1, 3)
        samples.append(Sample(
            group_id=GroupId(index // 4), prompt_ids=[1] + [rng.randint(3, 12) for _ in range(3)] + [14],
            output_ids=[rng.randint(2, 12) for _ in range(length)],
            behaviour_logprobs=[-rng.uniform(1.5, 3.5) for _ in range(length)],
            token_versions=[0] * length, reward=float(rng.random() < 0.5)))
    return samples


@pytest.mark.timeout(120)
@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_two_ranks_hold_identical_weights_that_match_one_rank(ray_session, aggregation):
    settings = {**SETTINGS, "train": {**SETTINGS["train"], "loss_aggregation": aggregation}}
    cfg = FasyncConfig.model_validate({**settings, "resources": {"trainer_ranks": 2}})
    group = TrainerGroup(resolve(cfg))
    single = Trainer(resolve(FasyncConfig.model_validate(settings)))
    try:
        for version in range(2):
            records = group.train_rollout(rollout(version), version)
            expected = single.train_rollout(rollout(version), version)
            assert len(records) == len(expected) == 2
            for record, reference in zip(records, expected):
                assert not record["skipped"]
                for key in COMPARED:
                    assert record[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-6), key
        first, second = ray.get([rank.rollout_state_dict.remote() for rank in group.ranks])
    finally:
        group.kill()
    reference = single.rollout_state_dict()
    for name, tensor in reference.items():
        assert torch.equal(first[name], second[name]), name
        assert (first[name] - tensor).abs().max() < 1e-5, name
    # The two rollouts moved the weights well beyond that tolerance.
    initial = Trainer(resolve(FasyncConfig.model_validate(settings))).rollout_state_dict()
    assert max(float((initial[name] - tensor).abs().max()) for name, tensor in reference.items()) > 1e-2
