"""The fully_async rollouter's engine loop, without Ray: a scripted engine whose completions have
known lengths shows what a call holds and when groups leave it."""

from __future__ import annotations

import asyncio
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from sections import with_sections

from fasync.config.schema import FasyncConfig
from fasync.drivers.common import build_factory
from fasync.launch.wire import pack, unpack
from fasync.rollout.rollouter import Rollouter

N = 4
LONG, SHORT = 6, 1

CONFIG = {
    "mode": "fully_async",
    "model": {"n_layers": 1, "d_model": 16, "n_heads": 2, "max_seq_len": 16},
    "data": {"task": "reverse", "length": 3},
    "rollout": {"batch_size": 4, "n_samples_per_prompt": N, "max_new_tokens": LONG},
    "train": {"global_batch_size": 16, "micro_batch_size": 16},
    "async": {"max_weight_staleness": None, "max_concurrent_samples": 4 * N, "max_queue_size": 64},
}


def target_length(request_id: int) -> int:
    """Every third group needs long completions, the others short ones."""
    return LONG if request_id // N % 3 == 0 else SHORT


class Method:
    """A method as the rollouter calls an actor's: `.remote(...)` returns something to await."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        async def call():
            await asyncio.sleep(0)
            return self.fn(*args)

        return call()


class ScriptedEngine:
    """Generates `target_length` tokens per request, at most `token_budget` per call, and records
    every call's requests as (request_id, tokens they already had)."""

    def __init__(self):
        self.calls: list[list[tuple[int, int]]] = []
        self.aborts = 0
        self.version = 0
        self.generate = Method(self._generate)
        self.abort = Method(self._abort)
        self.load_weights = Method(self._load_weights)

    def _load_weights(self, weights, version):
        self.version = version

    def _abort(self):
        self.aborts += 1

    def _generate(self, packed: bytes, params, token_budget):
        requests = unpack(packed)
        self.calls.append([(req.request_id, len(req.output_ids)) for req in requests])
        out = []
        for req in requests:
            left = target_length(req.request_id) - len(req.output_ids)
            new = left if token_budget is None else min(left, token_budget)
            out.append(replace(req, output_ids=req.output_ids + [5] * new, logprobs=req.logprobs + [-1.0] * new,
                               token_versions=req.token_versions + [self.version] * new,
                               finish_reason="stop" if new == left else None))
        return pack(out)


def rollouter_for(partial: bool, tokens_per_call: int | None, **settings):
    cfg = FasyncConfig.model_validate(with_sections(
        CONFIG, **{"async": {**CONFIG["async"], "partial_rollout": partial, "tokens_per_call": tokens_per_call,
                             **settings}}))
    engine = ScriptedEngine()
    return cfg, engine, Rollouter(cfg, [engine], build_factory(cfg))


def stream(partial: bool, tokens_per_call: int | None, drains: int = 6):
    cfg, engine, rollouter = rollouter_for(partial, tokens_per_call)

    async def body():
        running = asyncio.create_task(rollouter.run())
        taken = []
        for _ in range(drains):
            groups, state = unpack(await rollouter.take(cfg.rollout.batch_size, train_version=0))
            assert state.ledger.balanced and state.queue_size == rollouter.queue.size()
            taken += groups
        await rollouter.stop()
        return taken, await running

    taken, ledger = asyncio.run(body())
    return engine, taken, ledger


def test_sliced_calls_let_new_prompts_join_while_long_completions_continue():
    engine, taken, ledger = stream(partial=True, tokens_per_call=2)
    for group in taken:
        assert all(req.finish_reason == "stop" for req in group.requests)
        assert {len(req.output_ids) for req in group.requests} == {target_length(group.requests[0].request_id)}
    assert any(any(had for _, had in call) and any(not had for _, had in call) for call in engine.calls)
    assert max(len(call) for call in engine.calls) <= 4 * N
    # Short groups admitted after a long one reach the queue before it.
    ids = [group.group_id for group in taken]
    assert ids != sorted(ids)
    assert ledger.balanced and ledger.produced == ledger.in_flight + ledger.dropped_total + ledger.queued
    assert ledger.queued >= len(taken) * N


@pytest.mark.parametrize("tokens_per_call", [None, 2])
def test_whole_calls_without_partial_rollout(tokens_per_call):
    engine, taken, _ = stream(partial=False, tokens_per_call=tokens_per_call)
    assert all(had == 0 for call in engine.calls for _, had in call)
    assert all(req.finish_reason == "stop" for group in taken for req in group.requests)


@pytest.mark.parametrize(("tokens_per_call", "aborts"), [(None, 1), (2, 0)])
def test_a_weight_sync_aborts_whole_calls_but_lets_a_slice_finish(tokens_per_call, aborts):
    cfg, engine, rollouter = rollouter_for(partial=True, tokens_per_call=tokens_per_call)

    async def body():
        running = asyncio.create_task(rollouter.run())
        await rollouter.take(cfg.rollout.batch_size, train_version=0)
        await rollouter.update_weights([None], 1)
        seen = engine.aborts
        await rollouter.take(cfg.rollout.batch_size, train_version=1)
        await rollouter.stop()
        await running
        return seen

    assert asyncio.run(body()) == aborts
    assert rollouter.version == 1


def test_a_drain_drops_groups_too_stale_for_its_version_and_regenerates_them():
    cfg, engine, rollouter = rollouter_for(partial=False, tokens_per_call=None, max_weight_staleness=1,
                                           stale_policy="regenerate")

    async def body():
        running = asyncio.create_task(rollouter.run())
        first, _ = unpack(await rollouter.take(cfg.rollout.batch_size, train_version=0))
        await asyncio.sleep(0.01)  # admission fills two drains' worth at version 0
        await rollouter.update_weights([None], 2)
        second, state = unpack(await rollouter.take(cfg.rollout.batch_size, train_version=2))
        await rollouter.stop()
        return first, second, state, await running

    first, second, state, ledger = asyncio.run(body())
    assert all(group.oldest_version == 0 for group in first)
    assert all(group.oldest_version == 2 for group in second)
    # The version-0 groups of the second drain were dropped, and their prompts generated again.
    stale = state.ledger.dropped["stale"] // N
    assert stale == cfg.rollout.batch_size
    regenerated = [group.group_id for group in second if group.group_id.attempt == 1]
    assert len(regenerated) == stale and {g.draw for g in regenerated} == set(range(4, 8))
    assert state.ledger.balanced and ledger.balanced


class CheckpointedEngine(ScriptedEngine):
    """A scripted engine with a sampling stream to save and restore, as a checkpoint needs."""

    def __init__(self):
        super().__init__()
        self.rng = 0
        self.rng_state = Method(lambda: self.rng)
        self.set_rng_state = Method(self._set_rng)

    def _set_rng(self, state):
        self.rng = state


def test_a_snapshot_keeps_queued_and_in_flight_groups_and_a_restore_continues_them_from_their_prefix():
    from fasync.metrics.ledger import audit

    cfg, engine, first = rollouter_for(partial=True, tokens_per_call=2)
    engine = CheckpointedEngine()
    first.engines = [engine]
    engine.rng = 7
    journal: list[dict] = []

    async def before_the_kill():
        running = asyncio.create_task(first.run())
        groups, _ = unpack(await first.take(cfg.rollout.batch_size, train_version=0))
        first.report_trained([g.group_id for g in groups], len(groups) * N, len(groups) * N)
        snapshot = unpack(await first.snapshot())
        # What the killed process did after the checkpoint is lost with it.
        await first.take(cfg.rollout.batch_size, train_version=0)
        await first.stop()
        await running
        return snapshot

    snapshot = asyncio.run(before_the_kill())
    journal += snapshot.pop("journal")
    in_flight, waiting = snapshot["in_flight"], snapshot["waiting"]
    assert waiting and all(group.finished for group in waiting)
    partial = [g for g in in_flight if any(req.output_ids for req in g.requests) and not g.finished]
    assert partial, "the snapshot caught no group part-way through its generation"
    assert snapshot["engine_rngs"] == [7]

    cfg, _, second = rollouter_for(partial=True, tokens_per_call=2)
    engine = CheckpointedEngine()
    second.engines = [engine]
    prefixes = {req.request_id: len(req.output_ids) for g in partial for req in g.requests}

    async def after_the_resume():
        journal.extend(await second.restore(pack({**snapshot, "journal": []})))
        running = asyncio.create_task(second.run())
        for _ in range(4):
            groups, _ = unpack(await second.take(cfg.rollout.batch_size, train_version=0))
            second.report_trained([g.group_id for g in groups], len(groups) * N, len(groups) * N)
        await second.stop()
        await running

    asyncio.run(after_the_resume())
    journal += second.take_journal()
    assert engine.rng == 7
    # Each partial request's first call after the resume started from the tokens it had at the checkpoint.
    first_seen = {}
    for call in engine.calls:
        for request_id, had in call:
            first_seen.setdefault(request_id, had)
    assert all(first_seen[rid] == had for rid, had in prefixes.items() if rid in first_seen)
    assert any(had > 0 for rid, had in prefixes.items() if rid in first_seen)

    path = Path(tempfile.mkdtemp()) / "ledger.jsonl"
    path.write_text("".join(json.dumps(entry) + "\n" for entry in journal))
    result = audit(path)
    assert result.ok, result.describe()
    assert result.states["trained"] == 5 * cfg.rollout.batch_size
    assert second.ledger.balanced
