from fasync.config.schema import FasyncConfig
from fasync.launch.plan import plan_resources
from fasync.metrics.ledger import Ledger


def test_ledger_balances_only_when_every_sample_is_accounted_for():
    ledger = Ledger(produced=64, consumed=32, queued=8, in_flight=16)
    ledger.drop("stale", 8)
    assert ledger.balanced
    ledger.drop("trimmed", 1)
    assert not ledger.balanced
    assert "UNBALANCED" in ledger.describe()
    assert ledger.as_dict()["dropped"] == {"stale": 8, "trimmed": 1}


def test_plan_counts_actors_and_resources():
    cfg = FasyncConfig.model_validate(
        {"mode": "fully_async", "resources": {"num_rollout_engines": 2, "gpus_per_engine": 1,
                                              "trainer_ranks": 2, "gpus_per_trainer_rank": 1}}
    )
    plan = plan_resources(cfg)
    assert plan.gpus_needed == 4
    assert plan.engine_options() == {"num_cpus": 1.0, "num_gpus": 1}
    roles = {spec.role for spec in plan.actors}
    assert roles == {"rollout engine", "trainer rank", "rollouter and its sample queue"}
    text = plan.describe()
    assert "2 × rollout engine" in text and "worst policy lag: 1" in text


def test_colocated_plan_shares_gpus():
    cfg = FasyncConfig.model_validate(
        {"resources": {"gpus_per_engine": 1, "gpus_per_trainer_rank": 1, "colocate": True}}
    )
    plan = plan_resources(cfg)
    assert plan.gpus_needed == 1.0
    assert plan.local_cluster_cpus() >= 2
