"""The resource plan (fasync.launch.plan): how many actors, GPUs and CPUs a config asks for, and where each
actor is placed."""

from fasync.config.schema import FasyncConfig
from fasync.launch.plan import resolve


def test_plan_counts_actors_and_resources():
    cfg = FasyncConfig.model_validate(
        {"mode": "fully_async", "resources": {"num_rollout_engines": 2, "gpus_per_engine": 1,
                                              "trainer_ranks": 2, "gpus_per_trainer_rank": 1}}
    )
    plan = resolve(cfg).plan
    assert plan.gpus_needed == 4
    assert plan.engine_options(1) == {"num_cpus": 1.0, "num_gpus": 1.0, "slot": plan.engine_slots[1]}
    assert plan.engine_slots[1].group == "engines" and plan.engine_slots[1].bundles == (1,)
    assert [slot.bundles for slot in plan.trainer_slots] == [(0,), (1,)]
    roles = {spec.role for spec in plan.actors}
    assert roles == {"rollout engine", "trainer rank", "rollouter and its sample queue"}
    text = plan.summary()
    assert "2 × rollout engine" in text and "worst policy lag: 1" in text


def test_colocated_plan_shares_gpus():
    cfg = FasyncConfig.model_validate(
        {"resources": {"gpus_per_engine": 1, "gpus_per_trainer_rank": 1, "colocate": True}}
    )
    plan = resolve(cfg).plan
    assert plan.gpus_needed == 1.0
    assert plan.local_cluster_cpus() >= 2
