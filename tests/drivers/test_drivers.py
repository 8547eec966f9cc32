"""The three drivers end to end on the shared Ray session, with the embedded tiny model.

Generation delays are injected with an engine actor that sleeps a random time
before each call, so that the async drivers see out-of-order, uneven progress.
A trainer actor that sleeps before each train call keeps generation ahead of
training, so that the async drivers run as far ahead as the staleness bound lets
them and the worst policy lag (`Derived.max_lag`) is reached, not only respected.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from algorithms import learning_params
from driver_runs import assert_ledger_balanced, run_mode, start_run
from sections import tiny_config

from fasync.config.schema import FasyncConfig

pytestmark = pytest.mark.ray

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


def slow_trainer(monkeypatch, delay_s: float) -> None:
    """Every trainer actor the run starts sleeps `delay_s` before each train call."""
    import ray

    from fasync.launch import actors

    class SlowTrainer(actors.TrainerActor.__ray_actor_class__):
        def train_rollout(self, samples, current_version):
            time.sleep(delay_s)
            return super().train_rollout(samples, current_version)

    monkeypatch.setattr(actors, "TrainerActor", ray.remote(SlowTrainer))




def assert_lag_reaches_the_bound(driver) -> None:
    """The policy lag, in optimizer steps, never exceeds the derived worst case and reaches it."""
    bound = driver.run.resolved.derived.max_lag.steps
    lags = [record["policy_lag_max"] for record in driver.run.writer.history]
    assert max(lags) == bound, (lags, bound)



def test_sync_trains_on_policy_and_accounts_for_every_sample(ray_session, tmp_path):
    cfg = tiny_config(train={"global_batch_size": 12, "micro_batch_size": 4, "num_rollouts": 6})
    driver = run_mode(cfg, tmp_path)
    history = driver.run.writer.history
    assert len(history) == cfg.train.num_rollouts  # 16 samples // 12 = one step per rollout
    assert all(r["staleness_max"] == 0 for r in history)
    assert [r["weight_version"] for r in history] == list(range(cfg.train.num_rollouts))
    assert driver.ledger.dropped["trimmed"] == 4 * cfg.train.num_rollouts
    assert_lag_reaches_the_bound(driver)  # 0: every step's samples come from its own weights
    assert_ledger_balanced(driver)
    for key in ("step", "rollout", "weight_version", "reward_mean", "loss", "kl", "entropy", "clip_fraction",
                "grad_norm", "tokens_per_s", "wall_time", "generate_time_s", "train_time_s",
                "weight_sync_time_s"):
        assert key in history[0], key


def test_sync_lag_spans_the_steps_of_a_rollout(ray_session, tmp_path):
    cfg = tiny_config(train={"num_rollouts": 2})  # 16 samples, 8 a step: the second step lags one
    driver = run_mode(cfg, tmp_path)
    assert [r["policy_lag_max"] for r in driver.run.writer.history] == [0, 1, 0, 1]
    assert_lag_reaches_the_bound(driver)


def test_every_epoch_adds_its_steps_to_the_sync_lag_and_trains_each_sample_once(ray_session, tmp_path):
    # 16 samples, 8 a step, 2 epochs: four steps per rollout on the rollout's data, lags 0 to 3 (N × E − 1).
    cfg = tiny_config(train={"num_rollouts": 2, "ppo_epochs": 2})
    driver = run_mode(cfg, tmp_path)
    history = driver.run.writer.history
    assert [r["policy_lag_max"] for r in history] == [0, 1, 2, 3] * 2
    assert [r["epoch"] for r in history] == [0, 0, 1, 1] * 2
    assert_lag_reaches_the_bound(driver)
    assert_ledger_balanced(driver)  # the second pass trains the same samples: counted once


LEARNING = {
    "model": {"d_model": 64, "n_heads": 4},
    "data": {"length": 2},
    "rollout": {"batch_size": 16, "n_samples_per_prompt": 8, "max_new_tokens": 2},
    "train": {"global_batch_size": 128, "micro_batch_size": 64, "num_rollouts": 60, "lr": 5e-3},
    "async": {"max_weight_staleness": 2, "partial_rollout": True},
    "correction": {"level": "token"},
}
"""tests/commands/test_cli_train.py's fully_async learning run (two-digit reversal, 60 drains), through the driver."""


def learning_run(tmp_path, **sections) -> list[dict]:
    """`LEARNING` with `sections` over it, run fully_async; one row per drain."""
    merged = {name: {**LEARNING.get(name, {}), **sections.get(name, {})} for name in {*LEARNING, *sections}}
    cfg = tiny_config(mode="fully_async", **merged)
    history = run_mode(cfg, tmp_path).run.writer.history
    return list({r["rollout"]: r for r in history}.values())


def gain(values: list[float], count: int = 10) -> float:
    return sum(values[-count:]) / count - sum(values[:count]) / count


@pytest.mark.slow
@pytest.mark.parametrize("train", learning_params(offset=1))
def test_each_algorithm_learns_in_fully_async(ray_session, tmp_path, train):
    """The mean reward of the last 10 drains beats the first 10's by 0.2 (grpo's run gains over 0.4)."""
    rewards = [row["reward_mean"] for row in learning_run(tmp_path, train=train)]
    assert gain(rewards) > 0.2, rewards


@pytest.mark.slow
def test_overlong_shaping_stops_completions_being_cut_off_in_fully_async(ray_session, tmp_path):
    # Budget 4, buffer 1: 2 digits and the stop token pay nothing, a completion cut off at 4 tokens pays 1. The
    # first drains, mostly from the initial weights, are 80% cut off, and without the shaping 80 to 100% stay so
    # for 60 drains. With it the policy learns to stop (at once, before it learns the 3-token answer): the 5th to
    # 10th drain reach 0 and drains 11 to 20 stay there (3 runs of 60 drains on an AMD EPYC; the later drains,
    # where a run may learn long answers again, are not run).
    truncated = [row["response_truncated_fraction"] for row in learning_run(
        tmp_path, reward={"overlong_buffer": 1}, rollout={"max_new_tokens": 4}, train={"num_rollouts": 20})]
    assert gain(truncated, count=3) < -0.5, truncated
    assert max(truncated[-5:]) < 0.1, truncated


# Bounds, (s + 1) × I × N − 1 with N = 2 steps per rollout: 3, 5 and 7 optimizer steps.
@pytest.mark.parametrize("staleness, interval", [(1, 1), (2, 1), (1, 2)])
def test_async_never_trains_beyond_the_bound(ray_session, tmp_path, monkeypatch, staleness, interval):
    slow_trainer(monkeypatch, 0.5)
    cfg = tiny_config(mode="async", train={"num_rollouts": 6},
                      **{"async": {"max_weight_staleness": staleness, "update_weights_interval": interval}})
    driver = run_mode(cfg, tmp_path, delayed_engines(cfg, 0.05, seed=staleness))
    history = driver.run.writer.history
    assert max(r["staleness_max"] for r in history) == staleness
    assert_lag_reaches_the_bound(driver)
    assert_ledger_balanced(driver)


# Bounds with N = 2 steps per drain: 3 optimizer steps, 7 with a sync every second drain.
@pytest.mark.parametrize("partial, engines, stale_policy, tokens_per_call, interval", [
    (False, 1, "drop", None, 1), (True, 1, "drop", None, 1), (False, 2, "regenerate", None, 1),
    (True, 2, "drop", 1, 1), (True, 2, "wait", 1, 1), (False, 1, "drop", None, 2)])
def test_fully_async_bound_holds_under_random_delays(ray_session, tmp_path, monkeypatch, partial, engines,
                                                     stale_policy, tokens_per_call, interval):
    slow_trainer(monkeypatch, 0.5)
    # Two engines finish groups out of admission order, so some can arrive staler than admission planned.
    cfg = tiny_config(
        mode="fully_async",
        train={"num_rollouts": 8},
        rollout={"max_new_tokens": 4},
        resources={"num_rollout_engines": engines},
        **{"async": {"max_weight_staleness": 1, "partial_rollout": partial, "max_concurrent_samples": 8,
                     "stale_policy": stale_policy, "tokens_per_call": tokens_per_call,
                     "update_weights_interval": interval}},
    )
    driver = run_mode(cfg, tmp_path, delayed_engines(cfg, 0.08, seed=7))
    history = driver.run.writer.history
    assert len({r["rollout"] for r in history}) == cfg.train.num_rollouts
    assert max(r["staleness_max"] for r in history) == 1
    assert_lag_reaches_the_bound(driver)
    for key in ("queue_size", "trainer_wait_s", "rollouter_pause_s", "version_diversity", "partial_ratio",
                "max_partial_span", "dropped_stale"):
        assert key in history[-1], key
    if stale_policy == "wait":  # nothing went stale in flight
        assert sum(r["dropped_stale"] for r in history if "dropped_stale" in r) == 0
    assert_ledger_balanced(driver)


def test_a_dead_engine_fails_the_run_quickly(ray_session, tmp_path):
    import ray

    from fasync.drivers import DRIVERS

    cfg = tiny_config(mode="fully_async", train={"num_rollouts": 1000})
    run = start_run(cfg, tmp_path)
    threading.Timer(2.0, lambda: ray.kill(run.engines[0])).start()

    started = time.monotonic()
    with pytest.raises(Exception) as failure:
        DRIVERS["fully_async"](run).train()
    assert time.monotonic() - started < 30
    assert "actor" in str(failure.value).lower() or "died" in str(failure.value).lower()
    run.close()


def test_a_dead_trainer_fails_the_async_run_quickly(ray_session, tmp_path):
    import ray

    from fasync.drivers import DRIVERS
    from fasync.errors import ActorFailed

    cfg = tiny_config(mode="async", train={"num_rollouts": 1000})
    run = start_run(cfg, tmp_path)
    threading.Timer(2.0, lambda: ray.kill(run.trainer.ranks[0])).start()

    started = time.monotonic()
    with pytest.raises(ActorFailed, match="trainer rank 0 died"):
        DRIVERS["async"](run).train()
    assert time.monotonic() - started < 30
    run.close()


def test_a_dead_rollouter_fails_the_run_quickly(ray_session, tmp_path):
    import ray

    from fasync.drivers import DRIVERS

    cfg = tiny_config(mode="fully_async", train={"num_rollouts": 1000})
    run = start_run(cfg, tmp_path)
    driver = DRIVERS["fully_async"](run)
    threading.Timer(2.0, lambda: ray.kill(driver.rollouter)).start()
    began = time.monotonic()
    with pytest.raises(Exception) as failure:
        driver.train()
    run.close()
    assert time.monotonic() - began < 30
    assert "actor" in str(failure.value).lower() or "rollouter" in str(failure.value).lower()


def recording_engines(cfg: FasyncConfig, log):
    """Real engine actors that append each generate call, weight load, sleep and wake-up to `log`, waiting
    until it is appended, so that the log holds them in the order they happened."""
    import ray

    from fasync.launch.actors import EngineActor

    @ray.remote(concurrency_groups={"control": 2})
    class RecordingEngine(EngineActor.__ray_actor_class__):
        def __init__(self, cfg, log):
            super().__init__(cfg)
            self.log = log

        def generate(self, requests, params, token_budget=None):
            ray.get(self.log.append.remote("generate"))
            return super().generate(requests, params, token_budget)

        def load_weights(self, weights, version):
            ray.get(self.log.append.remote(f"load {version}"))
            return super().load_weights(weights, version)

        def sleep(self):
            ray.get(self.log.append.remote("sleep"))
            super().sleep()

        def wake_up(self, tags=None):
            ray.get(self.log.append.remote(f"wake {' '.join(tags)}"))
            super().wake_up(tags)

    return [RecordingEngine.options(num_cpus=0).remote(cfg, log) for _ in range(cfg.resources.num_rollout_engines)]


@pytest.mark.parametrize(("mode", "colocate"), [("sync", True), ("sync", False), ("async", True)])
def test_colocated_sync_engines_sleep_while_the_trainer_trains(ray_session, tmp_path, monkeypatch, mode, colocate):
    import ray

    from fasync.launch import actors

    @ray.remote(num_cpus=0)
    class Log:
        def __init__(self):
            self.entries = []

        def append(self, entry):
            self.entries.append(entry)

        def read(self):
            return self.entries

    log = Log.remote()

    class LoggingTrainer(actors.TrainerActor.__ray_actor_class__):
        def train_rollout(self, samples, current_version):
            ray.get(log.append.remote("train"))
            return super().train_rollout(samples, current_version)

    monkeypatch.setattr(actors, "TrainerActor", ray.remote(LoggingTrainer))
    cfg = tiny_config(mode=mode, resources={"colocate": colocate}, train={"num_rollouts": 2})
    run_mode(cfg, tmp_path, recording_engines(cfg, log))
    entries = ray.get(log.read.remote())
    if mode == "sync" and colocate:
        # Training gets the engine's memory; the push lands in woken weights; generation gets its KV cache back.
        rollout = ["generate", "sleep", "train", "wake weights", "load {}", "wake kv_cache"]
        assert entries == ["load 0"] + [entry.format(v) for v in (1, 2) for entry in rollout]
    else:
        # Engines of their own, or an async run that generates while it trains: awake throughout.
        assert [entry for entry in entries if entry.startswith(("sleep", "wake"))] == []
        assert entries.count("train") == 2 and entries[0] == "load 0"


@pytest.mark.parametrize("mode", ["sync", "async", "fully_async"])
def test_dynamic_sampling_that_keeps_nothing_ends_the_run_after_its_rounds_in_every_mode(ray_session, tmp_path, mode):
    """Issue 32 §5.9 and §5.15: with a reward that is always the same, fully_async dropped groups until the stall
    watchdog fired (naming the wrong cause), and sync and async reported "finished (completed all 3 rollouts)"
    with 0 optimizer steps. Every mode now stops after `rollout.max_sampling_rounds` rounds' worth of groups,
    with one message."""
    import json

    import yaml
    from sections import tiny_sections

    from fasync.commands.train import run as train

    (tmp_path / "constant_reward.py").write_text("def zero(completion, label):\n    return 0.0\n")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_sections(
        mode=mode, reward={"function": "constant_reward:zero"},
        rollout={"dynamic_sampling": True, "max_sampling_rounds": 2},
        train={"num_rollouts": 3, "stall_timeout_s": 60})))
    out = tmp_path / "out"
    assert train(str(config), run_dir=str(out)) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "failed" and summary["optimizer_steps"] == 0
    # tiny: 4 groups a round (rollout.batch_size), 2 rounds.
    assert summary["stop_reason"].startswith(
        "failed: dynamic sampling dropped all 8 prompt groups of 2 sampling rounds (rollout.max_sampling_rounds: "
        "2): the rewards within every group agreed, so there was nothing to train on; check that reward.function "
        "tells completions apart"), summary["stop_reason"]
    assert summary["ledger"]["dropped"]["zero_variance"] >= 8 * 4


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_hung_reward_trips_the_stall_watchdog_naming_the_reward(ray_session, tmp_path, mode):
    """Issue 32 §5.5: in sync mode a reward that hangs was never reported (nothing after 200 s with
    train.stall_timeout_s 15), while fully_async reported it as a stall. The driver's modes score under the
    watchdog too."""
    import json

    import yaml
    from sections import tiny_sections

    from fasync.commands.train import run as train

    hang = tmp_path / "hang"
    hang.touch()
    module = f"hung_reward_{mode}"  # one per test: this process keeps every module it imported
    (tmp_path / f"{module}.py").write_text(
        "import os, time\n\n"
        "def score(completion, label):\n"
        f"    while os.path.exists({str(hang)!r}):  # until the test ends: the thread is left behind\n"
        "        time.sleep(0.1)\n"
        "    return 0.0\n")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_sections(mode=mode, reward={"function": f"{module}:score"},
                                                   train={"stall_timeout_s": 5})))
    started = time.monotonic()
    try:
        assert train(str(config), run_dir=str(tmp_path / "out")) == 1
    finally:
        hang.unlink()
    assert time.monotonic() - started < 120
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    reason = summary["stop_reason"]
    assert reason.startswith("failed: stalled: no optimizer step for") and "train.stall_timeout_s: 5" in reason
    assert f"the reward function ({module}:score) scoring 4 prompt groups" in reason, reason
