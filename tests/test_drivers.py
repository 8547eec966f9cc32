"""The three drivers end to end on the shared Ray session, with the embedded tiny model.

Generation delays are injected with an engine actor that sleeps a random time
before each call, so that the async drivers see out-of-order, uneven progress.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from sections import with_sections

from fasync.config.derived import derive
from fasync.config.schema import FasyncConfig
from fasync.metrics.progress import Progress

pytestmark = pytest.mark.ray

TINY = {
    "model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 16},
    "data": {"task": "reverse", "length": 3},
    "reward": {"function": "partial_match"},
    "rollout": {"batch_size": 4, "n_samples_per_prompt": 4, "max_new_tokens": 4},
    "train": {"global_batch_size": 8, "micro_batch_size": 4, "num_rollouts": 6, "lr": 3e-3},
    "logging": {"progress": "none"},
}


def tiny_config(**sections) -> FasyncConfig:
    return FasyncConfig.model_validate(with_sections(TINY, **sections))


def delayed_engines(cfg: FasyncConfig, max_delay_s: float, seed: int):
    import ray

    from fasync.launch.actors import EngineActor

    @ray.remote(concurrency_groups={"control": 1})
    class DelayedEngine(EngineActor.__ray_actor_class__):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.rng = random.Random(seed)

        def generate(self, requests, params, token_budget=None):
            time.sleep(self.rng.uniform(0.0, max_delay_s))
            return super().generate(requests, params, token_budget)

    return [DelayedEngine.options(num_cpus=0).remote(cfg) for _ in range(cfg.resources.num_rollout_engines)]


def start_run(cfg: FasyncConfig, tmp_path, engines=None):
    from fasync.drivers.common import Run, build_factory
    from fasync.launch.plan import plan_resources

    plan = plan_resources(cfg)
    return Run(cfg, derive(cfg), plan, build_factory(cfg), tmp_path, Progress(1, "none"), engines=engines)


def run_mode(cfg: FasyncConfig, tmp_path, engines=None):
    from fasync.launch.run import _driver

    run = start_run(cfg, tmp_path, engines)
    try:
        _driver(cfg.mode)(run)
    finally:
        run.close()
    return run


def assert_ledger_balanced(run) -> None:
    ledger = run.ledger
    assert ledger.balanced, ledger.describe()
    assert ledger.consumed > 0
    assert all(record["ledger_balanced"] for record in run.writer.history)


def test_sync_trains_on_policy_and_accounts_for_every_sample(ray_session, tmp_path):
    cfg = tiny_config(train={"global_batch_size": 12, "micro_batch_size": 4})
    run = run_mode(cfg, tmp_path)
    history = run.writer.history
    assert len(history) == cfg.train.num_rollouts  # 16 samples // 12 = one step per rollout
    assert all(r["staleness_max"] == 0 for r in history)
    assert [r["weight_version"] for r in history] == list(range(cfg.train.num_rollouts))
    assert run.ledger.dropped["trimmed"] == 4 * cfg.train.num_rollouts
    assert_ledger_balanced(run)
    for key in ("step", "rollout", "weight_version", "reward_mean", "loss", "kl", "entropy", "clip_fraction",
                "grad_norm", "tokens_per_s", "wall_time", "generate_time_s", "train_time_s",
                "weight_sync_time_s"):
        assert key in history[0], key


@pytest.mark.parametrize("staleness, interval", [(1, 1), (2, 1), (1, 2)])
def test_async_never_trains_beyond_the_bound(ray_session, tmp_path, staleness, interval):
    cfg = tiny_config(mode="async", **{"async": {"max_weight_staleness": staleness,
                                                 "update_weights_interval": interval}})
    run = run_mode(cfg, tmp_path, delayed_engines(cfg, 0.05, seed=staleness))
    history = run.writer.history
    steps = derive(cfg).num_steps_per_rollout
    assert max(r["staleness_max"] for r in history) <= staleness
    assert max(r["policy_lag_max"] for r in history) <= staleness + steps - 1
    # Overlap is real: some rollout was generated with older weights than it was trained with.
    assert max(r["staleness_max"] for r in history) >= 1
    assert_ledger_balanced(run)


@pytest.mark.parametrize("partial, engines, stale_policy, tokens_per_call", [
    (False, 1, "drop", None), (True, 1, "drop", None), (False, 2, "regenerate", None), (True, 2, "drop", 1)])
def test_fully_async_bound_holds_under_random_delays(ray_session, tmp_path, partial, engines, stale_policy,
                                                     tokens_per_call):
    # Two engines finish groups out of admission order, so some can arrive staler than admission planned.
    cfg = tiny_config(
        mode="fully_async",
        train={"num_rollouts": 8},
        rollout={"max_new_tokens": 4},
        resources={"num_rollout_engines": engines},
        **{"async": {"max_weight_staleness": 1, "partial_rollout": partial, "max_concurrent_samples": 8,
                     "stale_policy": stale_policy, "tokens_per_call": tokens_per_call}},
    )
    run = run_mode(cfg, tmp_path, delayed_engines(cfg, 0.08, seed=7))
    history = run.writer.history
    steps = derive(cfg).num_steps_per_rollout
    assert len({r["rollout"] for r in history}) == cfg.train.num_rollouts
    assert max(r["staleness_max"] for r in history) <= 1
    assert max(r["policy_lag_max"] for r in history) <= 1 + steps - 1
    for key in ("queue_size", "trainer_wait_s", "rollouter_pause_s", "version_diversity", "partial_ratio",
                "max_partial_span", "dropped_stale"):
        assert key in history[-1], key
    assert_ledger_balanced(run)


def test_a_dead_engine_fails_the_run_quickly(ray_session, tmp_path):
    import ray

    cfg = tiny_config(mode="fully_async", train={"num_rollouts": 1000})
    run = start_run(cfg, tmp_path)
    threading.Timer(2.0, lambda: ray.kill(run.engines[0])).start()
    from fasync.drivers.fully_async import run_fully_async

    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        run_fully_async(run)
    assert time.monotonic() - started < 30
    assert "actor" in str(failure.value).lower() or "died" in str(failure.value).lower()
    run.close()


def test_a_dead_trainer_fails_the_async_run_quickly(ray_session, tmp_path):
    import ray

    cfg = tiny_config(mode="async", train={"num_rollouts": 1000})
    run = start_run(cfg, tmp_path)
    threading.Timer(2.0, lambda: ray.kill(run.trainer.ranks[0])).start()
    from fasync.drivers.async_ import run_async

    started = time.monotonic()
    with pytest.raises(ray.exceptions.RayActorError):
        run_async(run)
    assert time.monotonic() - started < 30
    run.close()


def test_a_dead_rollouter_fails_the_run_quickly(ray_session, tmp_path, monkeypatch):
    import ray

    from fasync.drivers import fully_async

    cfg = tiny_config(mode="fully_async", train={"num_rollouts": 1000})
    run = start_run(cfg, tmp_path)
    started = []
    original = fully_async.FullyAsync.__init__

    def remember(self, run):
        original(self, run)
        started.append(self.rollouter)
        threading.Timer(2.0, lambda: ray.kill(self.rollouter)).start()

    monkeypatch.setattr(fully_async.FullyAsync, "__init__", remember)
    began = time.monotonic()
    with pytest.raises(Exception) as failure:
        fully_async.run_fully_async(run)
    run.close()
    assert started and time.monotonic() - began < 30
    assert "actor" in str(failure.value).lower() or "rollouter" in str(failure.value).lower()
