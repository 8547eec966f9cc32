"""The fully_async rollouter's engine loop, without Ray: a scripted engine whose completions have
known lengths shows what a call holds and when groups leave it."""

from __future__ import annotations

import asyncio
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from local_actors import LocalMethod
from sections import with_sections

from fasync.config.schema import FasyncConfig
from fasync.launch.plan import resolve
from fasync.rollout.groups import build_factory
from fasync.rollout.rollouter import Rollouter
from fasync.rollout.types import Generation
from fasync.wire import pack, unpack

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


class Dispatched(LocalMethod):
    """A method that runs when it is called, as a Ray actor runs its calls in the order they were sent (what
    `LocalMethod` defers to the await): a streaming engine must see a submit before a later abort."""

    def remote(self, *args):
        result = self.fn(*args)

        async def call():
            await asyncio.sleep(0)
            return result

        return call()


class ScriptedEngine:
    """Generates `target_length` tokens per request, at most `token_budget` per call, and records
    every call's requests as (request_id, tokens they already had)."""

    def __init__(self):
        self.calls: list[list[tuple[int, int]]] = []
        self.aborts = 0
        self.version = 0
        self.generate = LocalMethod(self._generate)
        self.abort = LocalMethod(self._abort)
        self.load_weights = LocalMethod(self._load_weights)

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


def rollouter_for(partial: bool, tokens_per_call: int | None, streaming: bool = False, **settings):
    """With `streaming`, `rollout.engine: vllm`: the rollouter streams requests into a `StreamingEngine`."""
    sections = {"async": {**CONFIG["async"], "partial_rollout": partial, "tokens_per_call": tokens_per_call,
                          **settings}}
    if streaming:
        sections["rollout"] = {**CONFIG["rollout"], "engine": "vllm"}
    cfg = FasyncConfig.model_validate(with_sections(CONFIG, **sections))
    engine = StreamingEngine() if streaming else ScriptedEngine()
    return cfg, engine, Rollouter(resolve(cfg), [engine], build_factory(resolve(cfg)))


def stream(partial: bool, tokens_per_call: int | None, drains: int = 6):
    cfg, engine, rollouter = rollouter_for(partial, tokens_per_call)

    async def body():
        running = asyncio.create_task(rollouter.run())
        taken = []
        for _ in range(drains):
            groups, state = (await rollouter.take(cfg.rollout.batch_size, train_version=0))
            assert state.ledger.balanced and state.queue_size == rollouter.queue.size()
            taken += groups
        await rollouter.stop()
        return taken, await running

    taken, ledger = asyncio.run(body())
    return engine, taken, ledger


class StreamingEngine(ScriptedEngine):
    """An engine that streams, as vLLM's does for the rollouter: `submit` adds requests to those it holds, and
    each `take_ended` is a decode step (one token for every request held, at the engine's version) unless a request
    has ended since the last one, and returns those that ended: time passes as the rollouter collects. Records every submit as ([(request_id, tokens it already had)],
    requests held before it), and how many requests it held at each weight load."""

    def __init__(self):
        super().__init__()
        self.held: dict[int, Generation] = {}
        self.ended: list[Generation] = []
        self.submits: list[tuple[list[tuple[int, int]], int]] = []
        self.held_at_loads: list[int] = []
        self.rng = 0
        self.submit = Dispatched(self._submit)
        self.take_ended = Dispatched(self._take_ended)
        self.abort = Dispatched(self._abort)
        self.load_weights = Dispatched(self._load_weights)
        self.load_weights_keeping_requests = Dispatched(self._load_weights_keeping_requests)
        self.rng_state = Dispatched(lambda: self.rng)
        self.set_rng_state = Dispatched(self._set_rng)

    def _set_rng(self, state):
        self.rng = state

    def _submit(self, packed: bytes, params):
        requests = unpack(packed)
        assert not {req.request_id for req in requests} & set(self.held), "a request submitted twice"
        self.submits.append(([(req.request_id, len(req.output_ids)) for req in requests], len(self.held)))
        self.held.update((req.request_id, req) for req in requests)

    def _take_ended(self):
        if not self.ended:
            for request_id, req in list(self.held.items()):
                req = replace(req, output_ids=req.output_ids + [5], logprobs=req.logprobs + [-1.0],
                              token_versions=req.token_versions + [self.version])
                self.held[request_id] = req
                if len(req.output_ids) == target_length(request_id):
                    self.ended.append(replace(self.held.pop(request_id), finish_reason="stop"))
        ended, self.ended = self.ended, []
        return pack(ended)

    def _abort(self):
        super()._abort()
        self.ended += [replace(req, finish_reason="abort") for req in self.held.values()]
        self.held.clear()

    def _load_weights(self, weights, version):
        self.held_at_loads.append(len(self.held))
        super()._load_weights(weights, version)

    def _load_weights_keeping_requests(self, weights, version):
        """The load between two decode steps, the requests held staying in the engine."""
        self._load_weights(weights, version)
        return (version, None), [request_id for request_id, req in self.held.items() if req.output_ids]


def sent(engine) -> list[list[tuple[int, int]]]:
    """What the engine was given to continue, call by call (submit by submit): (request_id, tokens it had)."""
    return [requests for requests, _ in engine.submits] if isinstance(engine, StreamingEngine) else engine.calls


def test_streamed_groups_leave_as_they_finish_and_new_ones_join_while_others_generate():
    cfg, engine, rollouter = rollouter_for(partial=False, tokens_per_call=4, streaming=True)
    assert rollouter.tokens_per_call is None  # the vLLM engine streams: `async.tokens_per_call` is the torch engine's

    async def body():
        running = asyncio.create_task(rollouter.run())
        taken = []
        for _ in range(6):
            groups, state = (await rollouter.take(cfg.rollout.batch_size, train_version=0))
            assert state.ledger.balanced
            taken += groups
        await rollouter.stop()
        return taken, await running

    taken, ledger = asyncio.run(body())
    assert engine.calls == []  # no closed batches
    assert all(req.finish_reason == "stop" for group in taken for req in group.requests)
    assert all({len(req.output_ids) for req in group.requests} == {target_length(group.requests[0].request_id)}
               for group in taken)
    # Groups joined while others were generating, and at most `max_concurrent_samples` requests were held.
    assert any(held_before > 0 for _, held_before in engine.submits)
    assert max(held_before + len(requests) for requests, held_before in engine.submits) <= 4 * N
    # Each request was submitted once, from nothing: no weight sync, nothing to resume.
    assert all(had == 0 for requests in sent(engine) for _, had in requests)
    # Short groups admitted after a long one reach the queue before it.
    ids = [group.group_id for group in taken]
    assert ids != sorted(ids)
    long_draws = [group.group_id.draw for group in taken if target_length(group.requests[0].request_id) == LONG]
    assert any(ids.index(group.group_id) < len(ids) - 1 and group.group_id.draw > long_draws[0]
               for group in taken if target_length(group.requests[0].request_id) == SHORT)
    assert ledger.balanced and ledger.produced == ledger.in_flight + ledger.dropped_total + ledger.queued


def test_a_weight_sync_that_keeps_the_kv_cache_loads_with_the_streamed_requests_in_the_engine():
    cfg, engine, rollouter = rollouter_for(partial=True, tokens_per_call=None, streaming=True, pause_mode="keep")

    async def body():
        running = asyncio.create_task(rollouter.run())
        taken = []
        for drain in range(6):
            groups, _ = (await rollouter.take(cfg.rollout.batch_size, train_version=drain))
            taken += groups
            assert await rollouter.update_weights([None], drain + 1) == [(drain + 1, None)]
        aborts = engine.aborts
        await rollouter.stop()
        await running
        return taken, aborts

    taken, aborts = asyncio.run(body())
    assert rollouter.version == 6 and aborts == 0
    # Loaded while the engine held requests, which went on there: each submitted once, from nothing.
    assert any(engine.held_at_loads)
    assert all(had == 0 for requests in sent(engine) for _, had in requests)
    requests = [req for group in taken for req in group.requests]
    assert all(req.token_versions == sorted(req.token_versions) and len(req.token_versions) == len(req.output_ids)
               for req in requests)
    # Tokens of two versions, the ones after the load carrying the new one; their groups count as resumed.
    assert any(len(set(req.token_versions)) > 1 for req in requests) and rollouter.resumed_groups > 0
    assert rollouter.ledger.balanced


@pytest.mark.parametrize("partial", [True, False])
def test_a_streamed_weight_sync_loads_only_an_idle_engine(partial):
    cfg, engine, rollouter = rollouter_for(partial=partial, tokens_per_call=None, streaming=True)

    async def body():
        running = asyncio.create_task(rollouter.run())
        taken = []
        for drain in range(6):
            groups, _ = (await rollouter.take(cfg.rollout.batch_size, train_version=drain))
            taken += groups
            await rollouter.update_weights([None], drain + 1)
        aborts = engine.aborts
        await rollouter.stop()
        await running
        return taken, aborts

    taken, aborts = asyncio.run(body())
    assert engine.held_at_loads == [0] * 6 and rollouter.version == 6
    assert aborts == (6 if partial else 0)
    spanning = [req for group in taken for req in group.requests if len(set(req.token_versions)) > 1]
    for req in (req for group in taken for req in group.requests):
        assert req.token_versions == sorted(req.token_versions) and len(req.token_versions) == len(req.output_ids)
    if partial:
        # Aborted at a sync, resubmitted from their prefix: tokens of two versions, counted as resumed.
        assert spanning and rollouter.resumed_groups > 0
        assert any(had > 0 for requests in sent(engine) for _, had in requests)
    else:
        # Without partial rollout every completion finishes under the weights it started with.
        assert spanning == [] and rollouter.resumed_groups == 0
        assert all(had == 0 for requests in sent(engine) for _, had in requests)


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
        first, _ = (await rollouter.take(cfg.rollout.batch_size, train_version=0))
        await asyncio.sleep(0.01)  # admission fills two drains' worth at version 0
        await rollouter.update_weights([None], 2)
        second, state = (await rollouter.take(cfg.rollout.batch_size, train_version=2))
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
        self.rng_state = LocalMethod(lambda: self.rng)
        self.set_rng_state = LocalMethod(self._set_rng)

    def _set_rng(self, state):
        self.rng = state


@pytest.mark.parametrize("streaming", [False, True])
def test_a_snapshot_keeps_queued_and_in_flight_groups_and_a_restore_continues_them_from_their_prefix(streaming):
    from fasync.metrics.ledger import audit

    cfg, engine, first = rollouter_for(partial=True, tokens_per_call=2, streaming=streaming)
    if not streaming:
        engine = CheckpointedEngine()
        first.engines = [engine]
    engine.rng = 7
    journal: list[dict] = []

    async def before_the_kill():
        running = asyncio.create_task(first.run())
        groups, _ = (await first.take(cfg.rollout.batch_size, train_version=0))
        first.report_trained([g.group_id for g in groups], len(groups) * N, len(groups) * N)
        while streaming and not any(req.output_ids for req in engine.held.values()):
            await asyncio.sleep(0)  # until the engine is part-way through what it holds
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

    cfg, engine, second = rollouter_for(partial=True, tokens_per_call=2, streaming=streaming)
    if not streaming:
        engine = CheckpointedEngine()
        second.engines = [engine]
    prefixes = {req.request_id: len(req.output_ids) for g in partial for req in g.requests}

    async def after_the_resume():
        journal.extend(await second.restore(pack({**snapshot, "journal": []})))
        running = asyncio.create_task(second.run())
        for _ in range(4):
            groups, _ = (await second.take(cfg.rollout.batch_size, train_version=0))
            second.report_trained([g.group_id for g in groups], len(groups) * N, len(groups) * N)
        await second.stop()
        await running

    asyncio.run(after_the_resume())
    journal += second.take_journal()
    assert engine.rng == 7
    # Each partial request's first call after the resume started from the tokens it had at the checkpoint.
    first_seen = {}
    for call in sent(engine):
        for request_id, had in call:
            first_seen.setdefault(request_id, had)
    assert all(first_seen[rid] == had for rid, had in prefixes.items() if rid in first_seen)
    assert any(had > 0 for rid, had in prefixes.items() if rid in first_seen)

    path = Path(tempfile.mkdtemp()) / "ledger.jsonl"
    path.write_text("".join(json.dumps(entry) + "\n" for entry in journal))
    result = audit(path)
    assert result.ok, result.report()
    assert result.states["trained"] == 5 * cfg.rollout.batch_size
    assert second.ledger.balanced


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("last", [False, True])
def test_after_the_last_snapshot_no_prompt_is_drawn_beyond_its_cursor(streaming, last):
    """Issue 32: a prefetched drain after the run's last checkpoint made room in the queue, and the engines drew
    new prompts beyond the cursor that checkpoint (the journal's end mark) recorded. A periodic snapshot lets
    generation go on; the last one keeps it paused until the stop."""
    cfg, engine, rollouter = rollouter_for(partial=True, tokens_per_call=2, streaming=streaming, max_queue_size=8)
    if not streaming:
        engine = CheckpointedEngine()
        rollouter.engines = [engine]

    async def body():
        running = asyncio.create_task(rollouter.run())
        groups, _ = (await rollouter.take(cfg.rollout.batch_size, train_version=0))
        rollouter.report_trained([g.group_id for g in groups], len(groups) * N, len(groups) * N)
        snapshot = unpack(await rollouter.snapshot(last))
        rollouter.take_journal()
        # The next drain's prefetched take (which may wait for groups until the stop closes the queue), then time
        # for the engines to fill the room it made.
        prefetched = asyncio.create_task(rollouter.take(cfg.rollout.batch_size, train_version=0))
        for _ in range(50):
            await asyncio.sleep(0)
        await rollouter.stop()
        await running
        await prefetched
        return snapshot["factory"]["draws"]

    cursor = asyncio.run(body())
    drawn_after = [int(group.split(".")[0]) for entry in rollouter.take_journal() if entry["event"] == "produced"
                   for group in entry["ids"]]
    if last:
        assert drawn_after == []
    else:
        assert drawn_after and min(drawn_after) >= cursor


@pytest.mark.parametrize("policy", ["drop", "wait"])
def test_under_stale_policy_wait_a_drain_waits_for_a_group_in_flight_that_would_miss_it(policy):
    """A long group admitted at version 0 is still generating when enough short groups of version 1 are queued for
    the drain at version 1 (bound 1). The next drain, at version 2, would find it too stale: `drop` takes the
    short ones and loses it there, `wait` waits for it and trains it now."""
    cfg, engine, rollouter = rollouter_for(partial=True, tokens_per_call=None, streaming=True,
                                           max_weight_staleness=1, stale_policy=policy, max_concurrent_samples=8 * N)

    def finish(group, version):
        group.requests = [replace(req, output_ids=[5], logprobs=[-1.0], token_versions=[version],
                                  finish_reason="stop") for req in group.requests]
        return group

    async def body():
        long, *short = rollouter._admit(5)
        assert len(short) == 4 and {group.admitted_version for group in [long, *short]} == {0}
        rollouter.version = 1  # a sync: the short groups generate under version 1
        for group in short:
            await rollouter._deliver(finish(group, 1))
        take = asyncio.create_task(rollouter.take(4, 1, 2))
        await asyncio.sleep(0.05)
        taken_early = take.done()
        await rollouter._deliver(finish(long, 0))
        first, _ = await take
        later = [] if policy == "wait" else (await asyncio.gather(
            asyncio.wait_for(rollouter.take(1, 2, 3), 0.05), return_exceptions=True))
        return taken_early, first, later

    taken_early, first, later = asyncio.run(body())
    stale = rollouter.ledger.dropped["stale"]
    if policy == "wait":
        assert not taken_early and first[0].oldest_version == 0  # waited, then took the oldest first
        assert stale == 0
    else:
        assert taken_early and {group.oldest_version for group in first} == {1}
        assert isinstance(later[0], asyncio.TimeoutError) and stale == N  # the long group, dropped at version 2
    assert rollouter.ledger.balanced
