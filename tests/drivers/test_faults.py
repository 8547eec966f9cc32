"""Faults that surface (issue 15 §4): NaN steps, a hung engine, an engine that keeps its old weights.

The trainer-level NaN test runs without Ray. The rest run `fasync train`'s own stop path (`_train`) on the
shared Ray session with engine actors that misbehave on purpose, and read the summary it leaves.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from dataclasses import replace

import pytest
import torch
from sections import tiny_config

from fasync.config.schema import FasyncConfig

# -- NaN and inf steps -------------------------------------------------------------------------------


def test_a_nan_loss_skips_the_step_and_leaves_weights_and_optimizer_untouched(monkeypatch):
    from fasync.data import build_dataset
    from fasync.data.scoring import RewardRunner
    from fasync.launch.plan import resolve
    from fasync.model import build_tokenizer
    from fasync.rollout.build import build_engine
    from fasync.rollout.groups import GroupFactory
    from fasync.train import trainer as trainer_module

    cfg = tiny_config(train={"global_batch_size": 16, "micro_batch_size": 8})
    tokenizer = build_tokenizer(cfg.model, cfg.data)
    factory = GroupFactory(cfg, tokenizer, build_dataset(cfg.data), RewardRunner(cfg.reward))
    engine = build_engine(cfg, tokenizer)
    trainer = trainer_module.Trainer(resolve(cfg))

    def rollout():
        groups = factory.new_groups(cfg.rollout.batch_size)
        generations = iter(engine.generate([r for g in groups for r in g.requests], factory.params))
        for group in groups:
            group.requests = [next(generations) for _ in group.requests]
            factory.score(group)
        return [sample for group in groups for sample in group.samples]

    samples = rollout()
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    surrogate = trainer_module.clipped_surrogate
    monkeypatch.setattr(trainer_module, "clipped_surrogate",
                        lambda logp, *rest: (surrogate(logp, *rest)[0] * math.nan, surrogate(logp, *rest)[1]))
    [record] = trainer.train_rollout(samples, 0)
    assert record["skipped"] and record["nonfinite_skipped"] == 1
    assert "non-finite loss" in record["skip_reason"] and "gradient" in record["skip_reason"]
    assert all(torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    assert not trainer.optimizer.state and trainer.steps == 0

    monkeypatch.setattr(trainer_module, "clipped_surrogate", surrogate)
    [record] = trainer.train_rollout(rollout(), 0)
    assert not record["skipped"] and record["nonfinite_skipped"] == 0 and math.isfinite(record["loss"])
    assert trainer.steps == 1 and not all(torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_bad_steps_in_a_row_are_counted_and_a_good_step_resets_the_count():
    from fasync.metrics.steps import BadSteps

    bad_steps = BadSteps()
    for record, expected in [({"nonfinite_skipped": 1, "skipped": True}, 1),
                             ({"skipped": True, "nonfinite_skipped": 0}, 1),  # all rejected: neither
                             ({"nonfinite_skipped": 1, "skipped": True}, 2),
                             ({"skipped": False, "nonfinite_skipped": 0}, 0)]:
        bad_steps.count(record)
        assert bad_steps.in_a_row == expected


# -- engines that misbehave ------------------------------------------------------------------------


def faulty_engines(cfg: FasyncConfig, faults: list[str | None]):
    """One engine actor per entry: None behaves; "hang" never returns from generate; "stale" reports every
    version it is sent but keeps serving the weights of its first load; "nan" reports NaN behaviour
    logprobs."""
    import ray

    from fasync.launch.actors import EngineActor
    from fasync.wire import pack, unpack

    @ray.remote(concurrency_groups={"control": 1})
    class FaultyEngine(EngineActor.__ray_actor_class__):
        def __init__(self, cfg, index, fault):
            super().__init__(cfg, index)
            self.fault = fault

        def generate(self, requests, params, token_budget=None):
            if self.fault == "hang":
                time.sleep(3600)
            if str(self.fault).startswith("sigterm-then-die:") and self.engine.weight_version >= 2:
                # As a SIGTERM to the process group does: the driver is asked to stop, and Ray's processes end.
                os.kill(int(self.fault.partition(":")[2]), signal.SIGTERM)
                os._exit(1)
            out = super().generate(requests, params, token_budget)
            if self.fault == "nan":
                out = pack([replace(gen, logprobs=[math.nan] * len(gen.logprobs)) for gen in unpack(out)])
            return out

        def load_weights(self, weights, version):
            if self.fault == "stale" and version > 0:
                self.engine._load_state_dict(self.engine.model.state_dict())  # the old weights, reloaded
                self.engine._version = version
                return self.engine.served_weights()
            return super().load_weights(weights, version)

    return [FaultyEngine.options(num_cpus=0).remote(cfg, index, fault) for index, fault in enumerate(faults)]


def train_with(cfg: FasyncConfig, tmp_path, faults: list[str | None]) -> tuple[int, dict, float]:
    """`fasync train`'s run and stop path with these engines: (exit code, summary, seconds)."""
    import ray

    from fasync.commands.train import train
    from fasync.launch.plan import resolve
    from fasync.rollout.groups import build_factory

    engines = faulty_engines(cfg, faults)
    started = time.monotonic()
    try:
        resolved = resolve(cfg)
        code = train(resolved, build_factory(resolved), tmp_path, engines=engines)
    finally:
        for engine in engines:
            ray.kill(engine)
    return code, json.loads((tmp_path / "summary.json").read_text()), time.monotonic() - started


@pytest.mark.ray
@pytest.mark.parametrize("mode, faults, expected", [
    # sync: every rollout waits for both engines, and only engine 1's call is left.
    ("sync", [None, "hang"], "waiting for engine 1's generate call"),
    # fully_async: with its only engine hung it stalls, and the rollouter, asked what it waits for, names the
    # engine. With another engine still generating, it goes on only until a weight sync, which waits for every
    # engine's call in flight to end; then it stalls too, and names the hung one.
    ("fully_async", ["hang"], "the rollouter waits for engine 0's generate call"),
    ("fully_async", [None, "hang"], "the rollouter waits for engine 1's generate call"),
])
def test_a_hung_engine_trips_the_watchdog_naming_the_engine(ray_session, tmp_path, mode, faults, expected):
    cfg = tiny_config(mode=mode, resources={"num_rollout_engines": len(faults)}, train={"stall_timeout_s": 5})
    code, summary, _ = train_with(cfg, tmp_path, faults)
    assert code == 1 and summary["outcome"] == "failed"
    reason = summary["stop_reason"]
    assert reason.startswith("failed: stalled: no optimizer step for") and "train.stall_timeout_s: 5" in reason
    assert expected in reason, reason
    if mode == "sync":
        assert "engine 0" not in reason, reason


@pytest.mark.ray
def test_actors_that_end_after_a_stop_signal_end_the_run_as_the_signal_asked(ray_session, tmp_path):
    """A SIGTERM to the process group reaches Ray's own processes as well as the driver; when they end the actors
    before the clean stop is done, the run still exits 143, "terminated", and says what the stop could not do."""
    cfg = tiny_config(resources={"num_rollout_engines": 1})
    code, summary, _ = train_with(cfg, tmp_path, [f"sigterm-then-die:{os.getpid()}"])
    assert code == 143 and summary["outcome"] == "terminated"
    reason = summary["stop_reason"]
    assert re.match(r"terminated by SIGTERM at optimizer step \d+; the clean stop could not finish \(engine 0's "
                    r"generate call failed: engine 0 died .*\), so the last checkpoint stands$", reason), reason


@pytest.mark.ray
def test_an_engine_that_keeps_its_old_weights_fails_the_verified_sync(ray_session, tmp_path):
    cfg = tiny_config(resources={"num_rollout_engines": 2})
    code, summary, _ = train_with(cfg, tmp_path, [None, "stale"])
    assert code == 1 and summary["outcome"] == "failed"
    # The first versions may equal version 0 (the tiny model's first rollouts can have zero advantages, hence
    # zero gradients): the check fails at the first version whose weights differ, and names it.
    found = re.search(r"weight sync: engine 1 serves version (\d+) with weight checksum \w+, but the trainer sent "
                      r"version (\d+) with checksum \w+", summary["stop_reason"])
    assert found and found[1] == found[2] and int(found[1]) >= 1, summary["stop_reason"]
    assert summary["weight_version"] == int(found[1])


@pytest.mark.ray
@pytest.mark.parametrize("max_bad_steps, outcome", [(2, "failed"), (10, "finished")])
def test_nan_steps_are_skipped_and_too_many_in_a_row_stop_the_run(ray_session, tmp_path, max_bad_steps, outcome):
    # The behaviour logprobs anchor the PPO ratio: NaN ones make the loss NaN on every step.
    cfg = tiny_config(correction={"ratio_anchor": "behaviour"},
                      train={"max_bad_steps": max_bad_steps, "num_rollouts": 3, "global_batch_size": 16,
                             "micro_batch_size": 8})  # one step per rollout
    code, summary, _ = train_with(cfg, tmp_path, ["nan"])
    assert summary["outcome"] == outcome and code == (1 if outcome == "failed" else 0)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(row["nonfinite_skipped"] == 1 and row["skipped"] for row in rows)
    assert summary["nonfinite_steps_skipped"] == len(rows) == min(max_bad_steps, 3)
    if outcome == "failed":
        assert "2 optimizer steps in a row had a NaN or inf loss or gradient" in summary["stop_reason"]
        assert "train.max_bad_steps: 2" in summary["stop_reason"]


def test_the_weight_checksum_tells_other_weights_apart_and_ignores_the_rest():
    from fasync.weights.checksum import probed_names, weights_checksum

    names = [f"layers.{i}.weight" for i in range(7)]
    assert probed_names(names) == ["layers.0.weight", "layers.3.weight", "layers.6.weight"]
    state = {name: torch.randn(100, 10) for name in names}
    probed = {name: state[name] for name in probed_names(state)}
    same = {name: tensor.clone() for name, tensor in probed.items()}
    assert weights_checksum(probed) == weights_checksum(same)
    same["layers.3.weight"][-1, -1] += 1e-3  # the last element is always among those checked
    assert weights_checksum(probed) != weights_checksum(same)
    assert weights_checksum(probed) == weights_checksum({**probed, "layers.0.weight": probed["layers.0.weight"].double()})


# -- the stop path's signals -------------------------------------------------------------------------


def test_a_signal_during_the_stop_skips_the_graceful_steps_and_nothing_else():
    import os
    import signal

    from fasync.launch.signals import Stop, StopSignals

    messages: list[str] = []
    # What restore must put back: Python's own handler, or SIG_IGN where the process was started with SIGINT
    # ignored (a background job of a non-interactive shell).
    before = signal.getsignal(signal.SIGINT)
    signals = StopSignals(messages.append)
    signals.install()
    try:
        with pytest.raises(Stop) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        assert stopped.value.signum == signal.SIGTERM and signals.first == signal.SIGTERM
        signals.begin_stop()
        ran = []
        assert signals.graceful("the checkpoint", lambda: ran.append("checkpoint"))

        def interrupted():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
            ran.append("not reached")

        assert not signals.graceful("ending the actors", interrupted)
        assert not signals.graceful("anything after", lambda: ran.append("after"))
        os.kill(os.getpid(), signal.SIGINT)  # outside a graceful step: recorded, nothing raised
        assert ran == ["checkpoint"] and signals.received == [signal.SIGTERM, signal.SIGINT, signal.SIGINT]
        assert "fasync train: skipped ending the actors" in messages and any("skipping the rest" in m for m in messages)
    finally:
        signals.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_signal_that_comes_where_python_cannot_raise_is_kept_and_raised_later(monkeypatch):
    """A Ctrl-C during Ray's start-up that came while importlib ran a weakref callback was printed as "Exception
    ignored" and lost: the run went on training (CI, stop 39). A `__del__` is such a place too."""
    import os
    import signal
    import sys

    from fasync.launch.signals import Stop, StopSignals

    class SignalledWhileCollected:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the handler runs here, inside __del__

    class FailsWhileCollected:
        def __del__(self):
            raise ValueError("not a stop")

    printed = []  # Python's own hook prints what cannot be raised; this one keeps it
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: printed.append(unraisable.exc_value))
    signals = StopSignals(lambda message: None)
    signals.install()
    try:
        SignalledWhileCollected()  # collected at once: no reference is kept
        FailsWhileCollected()
        with pytest.raises(Stop) as stopped:
            signals.raise_swallowed()
        signals.raise_swallowed()  # raised once
    finally:
        signals.restore()
    assert stopped.value.signum == signal.SIGINT and signals.received == [signal.SIGINT]
    assert [type(error) for error in printed] == [ValueError]  # other failures go where they went before
    assert sys.unraisablehook is not signals._unraisable


def test_the_first_signal_of_a_started_run_asks_it_to_stop_cleanly_and_a_second_stops_it_now():
    import os
    import signal

    from fasync.launch.signals import Stop, StopSignals

    messages: list[str] = []
    asked: list[int] = []
    signals = StopSignals(messages.append, cooperative=lambda signum: asked.append(signum) or True)
    signals.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the run stops at the end of its rollout, with a checkpoint
        time.sleep(0.2)
        assert asked == [signal.SIGTERM]
        with pytest.raises(Stop) as stopped:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        assert stopped.value.signum == signal.SIGINT and asked == [signal.SIGTERM] and signals.first == signal.SIGTERM
        assert any("SIGINT again: skipping the rest of the clean stop" in m for m in messages)
    finally:
        signals.restore()
