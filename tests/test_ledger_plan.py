from fasync.config.schema import FasyncConfig
from fasync.launch.plan import plan_resources
from fasync.metrics.ledger import Ledger


def test_every_transition_keeps_the_ledger_balanced():
    ledger = Ledger()
    ledger.admit(64)
    ledger.drop("zero_variance", 8)  # scored, dropped before it was queued
    ledger.deliver(40)
    ledger.drop("stale", 8)  # from the queue
    ledger.train(taken=24, trained=20)  # 4 trimmed
    assert (ledger.produced, ledger.in_flight, ledger.queued, ledger.consumed) == (64, 16, 8, 20)
    assert ledger.dropped == {"zero_variance": 8, "stale": 8, "trimmed": 4}
    assert ledger.balanced and "balanced" in ledger.balance_sheet()


def test_a_count_gone_negative_or_missing_is_unbalanced():
    ledger = Ledger()
    ledger.admit(4)
    ledger.deliver(4)
    ledger.train(taken=8, trained=8)  # more than was queued
    assert not ledger.balanced and "UNBALANCED" in ledger.balance_sheet()
    assert not Ledger(produced=1).balanced


def test_a_ledger_crosses_to_another_process_as_a_copy():
    import pickle

    ledger = Ledger()
    ledger.admit(4)
    copy = pickle.loads(pickle.dumps(ledger))
    copy.deliver(4)
    assert copy.balanced and (ledger.in_flight, copy.queued) == (4, 4)


def test_plan_counts_actors_and_resources():
    cfg = FasyncConfig.model_validate(
        {"mode": "fully_async", "resources": {"num_rollout_engines": 2, "gpus_per_engine": 1,
                                              "trainer_ranks": 2, "gpus_per_trainer_rank": 1}}
    )
    plan = plan_resources(cfg)
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
    plan = plan_resources(cfg)
    assert plan.gpus_needed == 1.0
    assert plan.local_cluster_cpus() >= 2
