"""Custom rollout functions and the engine client, without Ray: a scripted engine answers each turn, and a
rollout function that waits on a 'tool' between its two turns shows what a weight sync does meanwhile."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from local_actors import LocalMethod
from sections import tiny_config

from fasync.errors import ConfigurationError
from fasync.launch.plan import resolve
from fasync.rollout.env_loop import Step
from fasync.rollout.groups import build_factory
from fasync.rollout.rollouter import Rollouter
from fasync.rollout.trajectory import observation_ids
from fasync.wire import pack, unpack

TURN_TOKENS = 3
gate: dict[str, asyncio.Event] = {}
"""The 'tool' a trajectory waits on between its turns: `gate["tool"]`, set by a test (absent: no wait)."""
waiting_on_tool = 0


async def two_turns(task, engine):
    """A rollout function: a model turn, a tool result, a second model turn; reward 1 when the second turn's
    first token continues from the observation it was given."""
    global waiting_on_tool
    trajectory = task.trajectory()
    trajectory.add_turn(await engine.generate(trajectory.context))
    if "tool" in gate:
        waiting_on_tool += 1
        await gate["tool"].wait()
    trajectory.add_observation(observation_ids(task.tokenizer, [{"role": "tool", "content": "7"}]))
    trajectory.add_turn(await engine.generate(trajectory.context, max_new_tokens=2))
    trajectory.reward = 1.0
    return trajectory


class GatedGame:
    """An environment of up to three turns: each step scores 1 and counts itself; its second step waits on
    `gate["tool"]` (when set), done after two steps. Its step count is what a checkpoint must keep."""

    async def reset(self, task):
        self.steps = 0
        return [{"role": "user", "content": "1"}]

    async def step(self, model_text):
        global waiting_on_tool
        self.steps += 1
        if self.steps == 2 and "tool" in gate:
            waiting_on_tool += 1
            await gate["tool"].wait()
        return Step([{"role": "user", "content": "2"}], reward=1.0, done=self.steps == 2)


def not_async(task, engine):
    return task.trajectory()


async def returns_text(task, engine):
    return "42"


class TurnEngine:
    """Answers every request with up to TURN_TOKENS tokens of its weight version's id, then its turn's end;
    records each call's batch size."""

    def __init__(self, end_id: int):
        self.end_id = end_id
        self.version = 0
        self.batches: list[int] = []
        self.generate = LocalMethod(self._generate)
        self.load_weights = LocalMethod(self._load)
        self.abort = LocalMethod(lambda: None)
        self.rng_state = LocalMethod(lambda: None)
        self.set_rng_state = LocalMethod(lambda state: None)

    def _load(self, weights, version):
        self.version = version
        return version, None

    def _generate(self, packed: bytes, params, token_budget=None):
        requests = unpack(packed)
        self.batches.append(len(requests))
        out = []
        for req in requests:
            tokens = ([5] * TURN_TOKENS + [self.end_id])[:params.max_new_tokens]
            out.append(replace(req, output_ids=tokens, logprobs=[-0.5] * len(tokens),
                               token_versions=[self.version] * len(tokens),
                               finish_reason="stop" if tokens[-1] == self.end_id else "length"))
        return pack(out)


def agentic_config(**sections):
    return tiny_config(rollout={"batch_size": 2, "n_samples_per_prompt": 2, "max_new_tokens": 8,
                                "function": "test_agent:two_turns"}, **sections)


def test_a_rollout_function_builds_trajectories_whose_turns_share_engine_calls():
    gate.clear()
    cfg = agentic_config()
    factory = build_factory(resolve(cfg))
    engine = TurnEngine(factory.tokenizer.stop_token_ids[-1])
    groups = factory.agent.generate([engine], factory.new_groups(2), factory.params)
    # Four trajectories, two turns each: the first turns go in one call, the second turns in another.
    assert engine.batches == [4, 4]
    for group in groups:
        factory.score(group)
        for sample in group.samples:
            assert sample.reward == 1.0
            model = [t for t, keep in zip(sample.output_ids, sample.trained) if keep]
            assert model == [5, 5, 5, engine.end_id, 5, 5]
            assert sum(not keep for keep in sample.trained) > 0
        assert [outcome.stats.turns for outcome in group.outcomes] == [2, 2]


def test_a_weight_sync_does_not_wait_for_a_tool_and_the_next_turn_uses_the_new_weights():
    global waiting_on_tool
    waiting_on_tool = 0
    cfg = agentic_config(mode="fully_async", **{"async": {"max_weight_staleness": None, "max_queue_size": 8}})
    factory = build_factory(resolve(cfg))
    engine = TurnEngine(factory.tokenizer.stop_token_ids[-1])
    rollouter = Rollouter(resolve(cfg), [engine], factory)

    async def body():
        gate["tool"] = asyncio.Event()
        running = asyncio.create_task(rollouter.run())
        while waiting_on_tool < 2:
            await asyncio.sleep(0.01)
        # Every trajectory of the first group waits on its tool: the sync loads at once.
        await asyncio.wait_for(rollouter.update_weights([None], 1), timeout=5)
        gate["tool"].set()
        groups, state = (await rollouter.take(1, train_version=1))
        await rollouter.stop()
        await running
        return groups, state

    try:
        groups, state = asyncio.run(body())
    finally:
        gate.clear()
    sample = groups[0].samples[0]
    trained_versions = [v for v, keep in zip(sample.token_versions, sample.trained) if keep]
    assert trained_versions == [0] * (TURN_TOKENS + 1) + [1, 1]
    assert sample.oldest_version == 0 and sample.newest_version == 1
    assert state.ledger.balanced


def snapshot_while_tools_wait(cfg):
    """A fully_async rollouter on `cfg` run until two trajectories wait on their tools, then snapshotted and
    stopped, as a checkpoint before a kill: (its snapshot, the ledger journal it held, the engines' end id)."""
    global waiting_on_tool
    waiting_on_tool = 0
    factory = build_factory(resolve(cfg))
    end_id = factory.tokenizer.stop_token_ids[-1]
    first = Rollouter(resolve(cfg), [TurnEngine(end_id)], factory)

    async def before_the_kill():
        gate["tool"] = asyncio.Event()
        running = asyncio.create_task(first.run())
        while waiting_on_tool < 2:
            await asyncio.sleep(0.01)
        snapshot = unpack(await first.snapshot())
        await first.stop()
        await running
        return snapshot

    try:
        snapshot = asyncio.run(before_the_kill())
    finally:
        gate.clear()
    return snapshot, snapshot.pop("journal"), end_id


def resume_for_two_drains(cfg, engine, snapshot: dict, journal: list, version: int) -> tuple:
    """A new rollouter restored from `snapshot`, as a resumed run's, taking two drains trained at `version`:
    (the groups taken, the rollouter); its journal entries are added to `journal`."""
    second = Rollouter(resolve(cfg), [engine], build_factory(resolve(cfg)))

    async def after_the_resume():
        journal.extend(await second.restore(pack({**snapshot, "journal": []})))
        running = asyncio.create_task(second.run())
        taken = []
        for _ in range(2):
            groups, _ = (await second.take(cfg.rollout.batch_size, train_version=version))
            second.report_trained([g.group_id for g in groups], len(groups) * 2, len(groups) * 2)
            taken += groups
        await second.stop()
        await running
        return taken

    taken = asyncio.run(after_the_resume())
    journal += second.take_journal()
    return taken, second


def assert_each_group_trained_once(journal: list, groups: int, tmp_path) -> None:
    from fasync.metrics.ledger import audit

    path = tmp_path / "ledger.jsonl"
    path.write_text("".join(json.dumps(entry) + "\n" for entry in journal))
    result = audit(path)
    assert result.ok, result.report()
    assert result.states["trained"] == groups


def test_a_checkpoint_mid_trajectory_restarts_it_and_the_ledger_proves_nothing_lost_or_trained_twice(tmp_path):
    cfg = agentic_config(mode="fully_async", **{"async": {"max_weight_staleness": None, "max_queue_size": 8}})
    snapshot, journal, end_id = snapshot_while_tools_wait(cfg)
    assert snapshot["in_flight"] and not any(group.finished for group in snapshot["in_flight"])

    taken, second = resume_for_two_drains(cfg, TurnEngine(end_id), snapshot, journal, version=0)
    # The restored trajectories ran again from their prompt: two whole turns each.
    assert all(outcome.stats.turns == 2 for group in taken for outcome in group.outcomes)
    assert_each_group_trained_once(journal, 2 * cfg.rollout.batch_size, tmp_path)  # groups: two drains
    assert second.ledger.balanced


def test_a_checkpoint_mid_trajectory_keeps_its_turns_and_the_resumed_run_goes_on_from_its_last_model_turn(tmp_path):
    """Snapshot while every trajectory waits on its second step: the resumed run keeps the first turn's tokens as
    sampled (version 0), the environment's step count and the reward so far, generates the second turn again
    (version 1) and finishes the trajectory; the ledger counts each group once."""
    cfg = tiny_config(mode="fully_async", model={"max_seq_len": 64}, **{
        "rollout": {"batch_size": 2, "n_samples_per_prompt": 2, "max_new_tokens": 8, "env": "test_agent:GatedGame",
                    "max_turns": 3, "max_observation_tokens": 8},
        "async": {"max_weight_staleness": None, "max_queue_size": 8}})
    snapshot, journal, end_id = snapshot_while_tools_wait(cfg)
    saved = {group.group_id: group.in_progress for group in snapshot["in_flight"] if group.in_progress}
    points = [point for in_progress in saved.values() for point in in_progress.values()]
    assert len(points) >= 2 and all(point.stats.turns == 1 and point.reward == 1.0 and point.state == {"steps": 1}
                                    for point in points)
    assert all(group.oldest_token_version == 0 for group in snapshot["in_flight"] if group.in_progress)

    engine = TurnEngine(end_id)
    engine.version = 1
    taken, second = resume_for_two_drains(cfg, engine, snapshot, journal, version=1)
    resumed = [group for group in taken if group.group_id in saved]
    assert resumed
    for group in resumed:
        for request_id, sample, outcome in zip([req.request_id for req in group.requests], group.samples,
                                               group.outcomes):
            kept = saved[group.group_id][request_id].request.output_ids
            assert sample.output_ids[:len(kept)] == kept
            trained = [v for v, keep in zip(sample.token_versions, sample.trained) if keep]
            assert trained == [0] * (TURN_TOKENS + 1) + [1] * (TURN_TOKENS + 1)
            assert (outcome.stats.turns, outcome.reward, sample.reward) == (2, 2.0, 2.0)
    assert_each_group_trained_once(journal, 2 * cfg.rollout.batch_size, tmp_path)
    assert second.ledger.balanced


@pytest.mark.parametrize("spec, message", [
    ("no_such_module:f", "rollout.function: cannot import module 'no_such_module'"),
    ("test_agent:missing", "module 'test_agent' has no attribute 'missing'"),
    ("test_agent:not_async", "must be an `async def` function"),
])
def test_a_rollout_function_that_does_not_import_is_a_configuration_error(spec, message):
    with pytest.raises(ConfigurationError, match=message):
        build_factory(resolve(tiny_config(rollout={"function": spec})))


def test_a_rollout_function_that_returns_no_trajectory_is_named():
    cfg = tiny_config(rollout={"batch_size": 1, "n_samples_per_prompt": 1, "function": "test_agent:returns_text"})
    factory = build_factory(resolve(cfg))
    with pytest.raises(ConfigurationError, match="returned a str, not a Trajectory"):
        factory.agent.generate([TurnEngine(0)], factory.new_groups(1), factory.params)
