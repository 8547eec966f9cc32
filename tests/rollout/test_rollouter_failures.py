"""On a real Ray cluster: a weight sync that fails because the trainer died names the trainer. The engine's load
fails with the death of the trainer that was still making the weights, not its own, and the rollouter (which
the driver gives every actor's name) says which actor that was."""

import asyncio
import time

import pytest
from sections import tiny_config

from fasync.errors import ActorFailed, actor_id
from fasync.launch.plan import resolve
from fasync.rollout.groups import build_factory
from fasync.rollout.rollouter import Rollouter


def test_a_weight_load_that_fails_because_the_trainer_died_names_the_trainer(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class Trainer:
        def rollout_weights(self):
            time.sleep(60)  # killed while it makes them

    @ray.remote(num_cpus=0)
    class Engine:
        def load_weights(self, weights, version: int) -> tuple[int, str]:
            return version, "checksum"

    trainer, engine = Trainer.remote(), Engine.remote()
    resolved = resolve(tiny_config(mode="fully_async"))
    names = {actor_id(engine): "engine 0", actor_id(trainer): "trainer rank 0"}
    rollouter = Rollouter(resolved, [engine], build_factory(resolved), actor_names=names)
    weights = trainer.rollout_weights.remote()
    ray.kill(trainer)
    try:
        with pytest.raises(ActorFailed) as failure:
            asyncio.run(rollouter.update_weights([weights], 1))
    finally:
        ray.kill(engine)
    assert str(failure.value).startswith("engine 0's weight load (version 1) failed: trainer rank 0 died"), \
        failure.value
