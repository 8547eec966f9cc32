"""Two data-parallel trainer ranks (Ray actors, gloo) against one rank on the same rollout."""


import pytest
import ray
import torch
from rank_parity import COMPARED, RECORD_TOLERANCE, SETTINGS, WEIGHT_TOLERANCE, rollout

from fasync.config.schema import FasyncConfig
from fasync.launch.actors import TrainerGroup
from fasync.launch.plan import resolve
from fasync.train.trainer import Trainer

torch.set_num_threads(1)


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
                    assert record[key] == pytest.approx(reference[key], **RECORD_TOLERANCE), key
        first, second = ray.get([rank.rollout_state_dict.remote() for rank in group.ranks])
    finally:
        group.kill()
    reference = single.rollout_state_dict()
    for name, tensor in reference.items():
        assert torch.equal(first[name], second[name]), name
        assert (first[name] - tensor).abs().max() < WEIGHT_TOLERANCE, name
    # The two rollouts moved the weights well beyond that tolerance.
    initial = Trainer(resolve(FasyncConfig.model_validate(settings))).rollout_state_dict()
    assert max(float((initial[name] - tensor).abs().max()) for name, tensor in reference.items()) > 2e-3
