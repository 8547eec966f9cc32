"""The torch engine and the trainer on a CUDA device (skipped without one): the same logprobs on
both sides, and a step that moves the weights."""

import pytest
import torch

from fasync.config.schema import FasyncConfig
from fasync.launch.plan import resolve
from fasync.rollout.build import build_engine
from fasync.rollout.groups import build_factory
from fasync.train.batching import collate
from fasync.train.trainer import Trainer

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

pytestmark = pytest.mark.gpu


def test_engine_and_trainer_agree_on_gpu_and_a_step_trains():
    cfg = FasyncConfig.model_validate({
        "data": {"length": 3}, "reward": {"function": "partial_match"},
        "rollout": {"batch_size": 8, "n_samples_per_prompt": 4, "max_new_tokens": 3},
        "train": {"global_batch_size": 32, "micro_batch_size": 16},
        "resources": {"gpus_per_engine": 1, "gpus_per_trainer_rank": 1},
    })
    factory = build_factory(resolve(cfg))
    engine = build_engine(cfg)
    trainer = Trainer(resolve(cfg))
    assert next(trainer.model.parameters()).is_cuda
    groups = factory.new_groups(cfg.rollout.batch_size)
    generations = iter(engine.generate([r for g in groups for r in g.requests], factory.params))
    for group in groups:
        group.requests = [next(generations) for _ in group.requests]
        factory.score(group)
    samples = [s for g in groups for s in g.samples]

    batch = collate(samples, trainer.pad_id).to(trainer.device)
    recomputed = trainer._logprobs(batch)
    mask = batch.completion_mask
    # Different CUDA kernels for the engine's cached decode steps and the trainer's forward round the fp32
    # logits differently; 1e-4 is the CPU tests' margin (test_trainer.py), not an ulp bound.
    assert torch.allclose(recomputed[mask], batch.behaviour_logprobs[mask], atol=1e-4)

    before = {k: v.clone() for k, v in trainer.rollout_state_dict().items()}
    record = trainer.train_rollout(samples, current_version=0)[0]
    assert not record["skipped"]
    after = trainer.rollout_state_dict()
    assert all(not t.is_cuda for t in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    engine.load_weights(after, 1)
    assert engine.weight_version == 1
