"""A checkpoint of the FSDP2 trainer through torch.distributed.checkpoint: two gloo ranks each write their
shards, and the checkpoint loads whole into one process (`fasync export`, a resume on fewer ranks) with the
very weights and optimizer step count the sharded trainer had."""

import pytest
import torch
import torch.multiprocessing as mp
from rank_parity import SETTINGS, leave_group, rollout

from fasync.checkpoint import Checkpoint
from fasync.checkpoint.state import load_policy, load_trainer, save_trainer
from fasync.config.schema import FasyncConfig
from fasync.launch.plan import resolve
from fasync.train import distributed
from fasync.train.trainer import Trainer

FSDP2 = {**SETTINGS, "train": {**SETTINGS["train"], "strategy": "fsdp2"}}


def _train_and_save(rank: int, world: int, port: int, out: str) -> dict:
    cfg = FasyncConfig.model_validate({**FSDP2, "resources": {"trainer_ranks": world}})
    trainer = Trainer(resolve(cfg), rank, world, f"tcp://127.0.0.1:{port}")
    trainer.train_rollout(rollout(0), 0)
    save_trainer(trainer, out)
    return trainer.rollout_state_dict()


def _rank(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    weights = _train_and_save(rank, world, port, out)
    if rank == 0:
        torch.save(weights, f"{out}/full.pt")
    leave_group()


@pytest.mark.timeout(300)
def test_an_fsdp2_checkpoint_is_sharded_and_loads_whole_into_one_process(tmp_path):
    mp.spawn(_rank, args=(2, distributed.free_port(), str(tmp_path)), nprocs=2, join=True)
    shards = sorted(p.name for p in (tmp_path / "trainer").glob("*.distcp"))
    assert len(shards) == 2, shards  # one file per rank: no gather to rank 0
    expected = torch.load(tmp_path / "full.pt")

    cfg = FasyncConfig.model_validate(SETTINGS)
    model, _ = load_policy(cfg, Checkpoint(tmp_path, {"step": 2}))
    assert model.state_dict().keys() == expected.keys()
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in expected.items())

    single = Trainer(resolve(cfg))
    load_trainer(single, tmp_path)
    assert single.steps == 2 and single.rollouts == 1
    assert all(torch.equal(single.model.state_dict()[name], tensor) for name, tensor in expected.items())
    moments = [state["exp_avg"] for state in single.optimizer.state.values()]
    assert moments and all(int(state["step"]) == 2 for state in single.optimizer.state.values())
