"""The vLLM engine on vLLM's CPU build (`make test-vllm`): one engine for the module, on a tiny Llama whose
head size (64) the CPU attention supports. Skipped where vllm is not installed (`make test`)."""

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from tiny_models import skip_unless_vllm_cpu, write_vllm_llama

from fasync.config.schema import FasyncConfig
from fasync.launch.plan import resolve
from fasync.model import build_model, build_tokenizer, token_logprobs
from fasync.rollout.build import build_engine
from fasync.rollout.groups import build_factory
from fasync.rollout.hf_engine import HFEngine
from fasync.rollout.rollouter import Rollouter
from fasync.rollout.types import Generation, SamplingParams
from fasync.weights.checksum import weights_checksum
from fasync.wire import pack, unpack

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

PROMPTS = ["12+3", "7", "what is 4+4?", "ab", "99", "x+y", "3", "hello"]
TOLERANCE = 1e-4
"""vLLM's CPU kernels against the trainer's torch forward, both fp32: two implementations of the same logits
round differently (and vLLM's CPU build picks its kernels by the CPU's instruction set), so this is a margin,
not an ulp bound. The logprobs of this tiny Llama are of order 1 to 10, where an fp32 ulp is at most 9.5e-7:
1e-4 is about 100 of them, still far below what a wrong version or position moves. vLLM's CPU build was not
installed on the AMD EPYC this margin was reviewed on, so it has been measured on Intel only."""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    skip_unless_vllm_cpu()
    directory = tmp_path_factory.mktemp("tiny-llama-vllm")
    write_vllm_llama(directory)
    cfg = FasyncConfig.model_validate({"model": {"path": str(directory)}, "rollout": {"engine": "vllm"}})
    tokenizer = build_tokenizer(cfg.model, cfg.data)
    trainer_model = build_model(cfg.model, tokenizer, seed=0).eval()
    # The model's own EOS id becomes a token greedy decoding produces early, so that a completion which
    # stops there shows vLLM stopping at the model's EOS (the torch engine does not: it obeys only the stop
    # ids it is given).
    greedy = greedy_reference(trainer_model, tokenizer.format_prompt(PROMPTS[0]), 3)
    model_eos = greedy[1]
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "eos_token_id": model_eos}))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [model_eos]}))
    return cfg, tokenizer, trainer_model, build_engine(cfg, tokenizer), model_eos


def requests(tokenizer):
    return [Generation(i, tokenizer.format_prompt(p)) for i, p in enumerate(PROMPTS)]


def greedy_reference(model, prompt_ids, steps):
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt_ids):]


def trainer_logprobs(model, gen: Generation, temperature: float) -> torch.Tensor:
    ids = torch.tensor([gen.prompt_ids + gen.output_ids])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected, _ = token_logprobs(model, ids, mask, mask.cumsum(-1) - 1, temperature)
    return expected[0, len(gen.prompt_ids) - 1:]


def assert_logprobs_are_the_trainers(model, generations, temperature: float) -> None:
    for gen in generations:
        assert len(gen.output_ids) == len(gen.logprobs) > 0
        torch.testing.assert_close(torch.tensor(gen.logprobs), trainer_logprobs(model, gen, temperature),
                                   atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_the_trainers_and_completions_obey_fasyncs_stop_ids(setup, temperature):
    cfg, tokenizer, model, engine, model_eos = setup
    stop = tokenizer.stop_token_ids[0]
    params = SamplingParams(max_new_tokens=12, temperature=temperature, stop_token_ids=(stop,))
    out = engine.generate(requests(tokenizer), params)
    assert_logprobs_are_the_trainers(model, out, temperature)
    for gen in out:
        # Ends at a stop id or at the budget, never elsewhere (not at the model's EOS).
        assert stop not in gen.output_ids[:-1]
        if gen.finish_reason == "stop":
            assert gen.output_ids[-1] == stop
        else:
            assert gen.finish_reason == "length" and len(gen.output_ids) == 12
        assert gen.token_versions == [0] * len(gen.output_ids)


def test_greedy_completions_are_the_torch_engines_under_one_stop_rule(setup):
    cfg, tokenizer, model, engine, model_eos = setup
    torch_engine = HFEngine(model, pad_id=tokenizer.pad_id)
    for stops in [(), (model_eos,)]:
        params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=stops)
        ours, theirs = engine.generate(requests(tokenizer), params), torch_engine.generate(requests(tokenizer), params)
        assert [g.output_ids for g in ours] == [g.output_ids for g in theirs]
        assert [g.finish_reason for g in ours] == [g.finish_reason for g in theirs]
    # The first prompt's greedy completion passes the model's EOS id unless fasync names it a stop id.
    assert len(ours[0].output_ids) == 2 and ours[0].finish_reason == "stop"


def test_abort_keeps_partial_tokens_and_logprobs_and_the_rest_resumes(setup, monkeypatch):
    cfg, tokenizer, model, engine, model_eos = setup
    params = SamplingParams(max_new_tokens=30)
    llm_engine = engine.llm.llm_engine
    step, steps = llm_engine.step, []

    def counted_step():
        steps.append(1)
        if len(steps) == 4:  # the prefill and three decode steps, then an abort from another thread
            threading.Thread(target=engine.abort).start()
            threading.Event().wait(0.2)
        return step()

    monkeypatch.setattr(llm_engine, "step", counted_step)
    partial = engine.generate(requests(tokenizer), params)
    monkeypatch.setattr(llm_engine, "step", step)
    aborted = [gen for gen in partial if gen.finish_reason == "abort"]
    assert aborted, [gen.finish_reason for gen in partial]
    assert all(0 < len(gen.output_ids) < 30 for gen in aborted)
    assert_logprobs_are_the_trainers(model, aborted, 1.0)

    for gen in aborted:
        gen.finish_reason = None
    resumed = engine.generate(aborted, params)
    for before, after in zip(aborted, resumed):
        assert after.finished and after.output_ids[:len(before.output_ids)] == before.output_ids
    assert_logprobs_are_the_trainers(model, resumed, 1.0)


def test_after_a_weight_push_logprobs_are_the_new_weights(setup, tmp_path):
    cfg, tokenizer, model, engine, model_eos = setup
    write_vllm_llama(tmp_path, seed=1)
    other = build_model(cfg.model.model_copy(update={"path": str(tmp_path)}), tokenizer, seed=0).eval()
    params = SamplingParams(max_new_tokens=6)
    try:
        engine.load_weights(other.state_dict(), version=3)
        assert engine.served_weights() == (3, None)  # vLLM cannot read its weights back: the logprobs show them
        out = engine.generate(requests(tokenizer), params)
        assert_logprobs_are_the_trainers(other, out, 1.0)
        assert all(gen.token_versions == [3] * len(gen.output_ids) for gen in out)
        # Were the push a no-op, the logprobs would be the old weights': far from these.
        old = torch.cat([trainer_logprobs(model, gen, 1.0) for gen in out])
        assert (old - torch.cat([torch.tensor(gen.logprobs) for gen in out])).abs().max() > 0.1
    finally:
        engine.load_weights(model.state_dict(), version=0)
        assert engine.served_weights()[0] == 0
    assert_logprobs_are_the_trainers(model, engine.generate(requests(tokenizer), params), 1.0)


# -- fully_async: requests streamed into the engine (fasync.rollout.vllm_stream) ---------------------------------


def held_tokens(engine) -> dict[int, int]:
    """Tokens each request in flight has generated so far, by fasync request id."""
    with engine._stream._changed:
        return {held.request.request_id: len(held.tokens) for held in engine._stream._held.values()}


def wait_for_tokens(engine, least: int) -> None:
    """Until every request in flight has generated at least `least` tokens."""
    deadline = time.monotonic() + 120
    while min(held_tokens(engine).values(), default=least) < least:
        assert time.monotonic() < deadline, held_tokens(engine)
        time.sleep(0.005)


def collect_all(engine, count: int) -> list[Generation]:
    ended: list[Generation] = []
    while len(ended) < count:
        ended += engine.take_ended()
    assert engine._stream.in_flight == 0
    return sorted(ended, key=lambda gen: gen.request_id)


def assert_logprobs_are_their_versions(models: dict, generations, temperature: float = 1.0) -> None:
    """Each token's behaviour logprob is the trainer's under the weights of the version it carries."""
    for gen in generations:
        assert len(gen.output_ids) == len(gen.logprobs) == len(gen.token_versions) > 0
        expected = {version: trainer_logprobs(model, gen, temperature) for version, model in models.items()}
        wanted = torch.stack([expected[version][i] for i, version in enumerate(gen.token_versions)])
        torch.testing.assert_close(torch.tensor(gen.logprobs), wanted, atol=TOLERANCE, rtol=0)


def kept_kv_logprobs(old, new, gen: Generation, switch: int, temperature: float = 1.0) -> torch.Tensor:
    """The logprobs of `gen`'s output tokens from index `switch` on, sampled by the `new` weights while the keys
    and values of the context before them stayed those the `old` weights computed: the prompt and the first
    `switch` − 1 output tokens (the last token sampled before the load enters the model only after it)."""
    ids = gen.prompt_ids + gen.output_ids
    cut = len(gen.prompt_ids) + switch - 1
    cache = old.new_cache(1, len(ids))
    with torch.no_grad():
        old(torch.tensor([ids[:cut]]), position_ids=torch.arange(cut)[None], cache=cache)
        logits = new(torch.tensor([ids[cut:]]), position_ids=torch.arange(cut, len(ids))[None], cache=cache)
    logprobs = torch.log_softmax(logits[0, :-1].float() / temperature, dim=-1)
    return logprobs.gather(-1, torch.tensor(ids[cut + 1:])[:, None])[:, 0]


def assert_logprobs_keep_the_old_kv(models: dict, generations) -> None:
    """Each token's behaviour logprob is that of the weights of its version, over keys and values computed by the
    weights of the version that was served when each context token entered the model: a completion sampled under
    one version throughout is that version's alone; one that spans a load that kept the KV cache continues
    after it with the new weights over the old weights' keys and values."""
    for gen in generations:
        versions = gen.token_versions
        assert len(gen.output_ids) == len(gen.logprobs) == len(versions) > 0
        switch = next((i for i, version in enumerate(versions) if version != versions[0]), len(versions))
        assert set(versions[switch:]) <= {versions[-1]} and len(set(versions)) <= 2, versions
        expected = trainer_logprobs(models[versions[0]], gen, 1.0)[:switch]
        if switch < len(versions):
            expected = torch.cat([expected, kept_kv_logprobs(models[versions[0]], models[versions[-1]], gen, switch)])
        torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=TOLERANCE, rtol=0)


EMBEDDING = "model.embed_tokens.weight"


def served_embedding_checksum(engine, vocab_size: int) -> str:
    """`weights_checksum` of the token embedding the vLLM worker samples with now, read back from its model: a
    parameter the CPU build keeps in the trainer's layout (unlike the linear layers it repacks), but with its rows
    padded to a multiple of vLLM's, which the checksum leaves out."""
    def read(worker):
        return weights_checksum({EMBEDDING: worker.model_runner.model.get_parameter(EMBEDDING)[:vocab_size]})

    return engine.llm.collective_rpc(read)[0]


@pytest.fixture(scope="module")
def other_weights(setup, tmp_path_factory):
    """A second policy (another seed): what a weight push sends."""
    cfg, tokenizer, *_ = setup
    directory = tmp_path_factory.mktemp("tiny-llama-other")
    write_vllm_llama(directory, seed=1)
    return build_model(cfg.model.model_copy(update={"path": str(directory)}), tokenizer, seed=0).eval()


def test_streamed_requests_leave_as_they_finish_a_short_one_before_a_long_one_submitted_first(setup):
    cfg, tokenizer, model, engine, model_eos = setup
    long_group = requests(tokenizer)[:4]
    short_group = [Generation(100 + i, gen.prompt_ids) for i, gen in enumerate(requests(tokenizer)[4:])]
    room = engine.llm.llm_engine.model_config.max_model_len - max(len(gen.prompt_ids) for gen in long_group)
    engine.submit(long_group, SamplingParams(max_new_tokens=room))
    wait_for_tokens(engine, 2)
    engine.submit(short_group, SamplingParams(max_new_tokens=2))
    first: list[Generation] = []
    while not first:
        first = engine.take_ended()
    # The short group was submitted after the long one and left first, while the long one went on generating.
    assert {gen.request_id for gen in first} <= {gen.request_id for gen in short_group}
    assert set(held_tokens(engine)) >= {gen.request_id for gen in long_group}
    ended = first + collect_all(engine, len(long_group) + len(short_group) - len(first))
    by_id = {gen.request_id: gen for gen in ended}
    assert all(len(by_id[gen.request_id].output_ids) == 2 for gen in short_group)
    assert all(len(by_id[gen.request_id].output_ids) == room for gen in long_group)
    assert all(gen.finish_reason == "length" and gen.token_versions == [0] * len(gen.output_ids) for gen in ended)
    assert_logprobs_are_the_trainers(model, ended, 1.0)


def test_an_abort_ends_streamed_requests_with_their_prefix_and_a_resubmit_continues_it(setup):
    cfg, tokenizer, model, engine, model_eos = setup
    params = SamplingParams(max_new_tokens=30)
    engine.submit(requests(tokenizer), params)
    wait_for_tokens(engine, 3)
    engine.abort()
    aborted = collect_all(engine, len(PROMPTS))
    assert all(gen.finish_reason == "abort" and 3 <= len(gen.output_ids) < 30 for gen in aborted)
    assert_logprobs_are_the_trainers(model, aborted, 1.0)

    engine.submit([replace(gen, finish_reason=None) for gen in aborted], params)
    resumed = collect_all(engine, len(PROMPTS))
    for before, after in zip(aborted, resumed):
        assert after.finished and after.output_ids[:len(before.output_ids)] == before.output_ids
    assert_logprobs_are_the_trainers(model, resumed, 1.0)


def test_a_weight_load_while_streamed_requests_are_paused_applies_to_their_next_tokens(setup, other_weights):
    cfg, tokenizer, model, engine, model_eos = setup
    engine.submit(requests(tokenizer), SamplingParams(max_new_tokens=20))
    wait_for_tokens(engine, 3)
    try:
        engine.pause()  # the requests stay in the engine, and no step runs
        before = held_tokens(engine)
        time.sleep(0.2)
        assert held_tokens(engine) == before and min(before.values()) >= 3
        engine.load_weights(other_weights.state_dict(), version=1)
        engine.resume()
        ended = collect_all(engine, len(PROMPTS))
    finally:
        engine.resume()
        engine.load_weights(model.state_dict(), version=0)
    for gen in ended:
        had = before[gen.request_id]
        assert gen.token_versions == [0] * had + [1] * (len(gen.output_ids) - had), gen.token_versions
    # The tokens after the load are the new weights' on the whole context: the keys and values of the tokens
    # before it were computed again, not kept from the old weights.
    assert_logprobs_are_their_versions({0: model, 1: other_weights}, ended)


def test_a_load_that_keeps_the_kv_cache_continues_each_request_from_its_prefix_over_the_old_keys_and_values(
        setup, other_weights, monkeypatch):
    cfg, tokenizer, model, engine, model_eos = setup
    monkeypatch.setattr(engine, "keeps_kv", True)  # as `async.pause_mode: keep` builds it
    embedding = {EMBEDDING: other_weights.state_dict()[f"lm.{EMBEDDING}"]}
    vocab_size = len(embedding[EMBEDDING])
    old_checksum = served_embedding_checksum(engine, vocab_size)
    engine.submit(requests(tokenizer), SamplingParams(max_new_tokens=20))
    wait_for_tokens(engine, 3)
    before = {}

    def load():
        before.update(held_tokens(engine))  # paused: what each request had when the weights changed
        engine.load_weights(other_weights.state_dict(), version=1)
        return engine.served_weights()

    try:
        served, kept = engine.load_weights_keeping_requests(load)
        new_checksum = served_embedding_checksum(engine, vocab_size)
        ended = collect_all(engine, len(PROMPTS))
    finally:
        engine.load_weights(model.state_dict(), version=0)
    assert served == (1, None) and sorted(kept) == sorted(before) == list(range(len(PROMPTS)))
    assert min(before.values()) >= 3
    for gen in ended:
        had = before[gen.request_id]
        assert gen.finish_reason == "length" and len(gen.output_ids) == 20
        assert gen.token_versions == [0] * had + [1] * (20 - had), gen.token_versions
    # The engine serves the new weights after the resume, read back from its model.
    assert new_checksum == weights_checksum(embedding) != old_checksum
    # The tokens before the load are the old weights'; after it, the new weights' over the old keys and values...
    assert_logprobs_keep_the_old_kv({0: model, 1: other_weights}, ended)
    # ...which is not what computing them again would give (the default, and `async.pause_mode: abort`).
    recomputed = torch.cat([trainer_logprobs(other_weights, gen, 1.0)[before[gen.request_id]:] for gen in ended])
    sampled = torch.cat([torch.tensor(gen.logprobs[before[gen.request_id]:]) for gen in ended])
    assert (recomputed - sampled).abs().max() > 0.1


class LocalEngine:
    """A streaming engine as the rollouter calls an `EngineActor`, without Ray: arguments and results `pack`ed as
    the actor packs them, and each call run in the order sent on the one thread of its concurrency group
    (`control`: submit, abort and the load that keeps the requests; the default group: the rest). Records every submit as (request_id, tokens it had)."""

    def __init__(self, engine):
        self.control, self.default = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
        self.submitted: list[tuple[int, int]] = []

        def submit(packed, params):
            requests = unpack(packed)
            self.submitted += [(req.request_id, len(req.output_ids)) for req in requests]
            engine.submit(requests, params)

        def load_weights(weights, version):
            engine.load_weights(weights, version)
            return engine.served_weights()

        def load_weights_keeping_requests(weights, version):
            return engine.load_weights_keeping_requests(lambda: load_weights(weights, version))

        self.submit = self._method(self.control, submit)
        self.load_weights_keeping_requests = self._method(self.control, load_weights_keeping_requests)
        self.abort = self._method(self.control, engine.abort)
        self.take_ended = self._method(self.default, lambda: pack(engine.take_ended()))
        self.load_weights = self._method(self.default, load_weights)
        self.rng_state = self._method(self.default, engine.rng_state)
        self.set_rng_state = self._method(self.default, engine.set_rng_state)

    @staticmethod
    def _method(executor, fn):
        return SimpleNamespace(remote=lambda *args: asyncio.get_running_loop().run_in_executor(executor, fn, *args))

    def close(self):
        self.control.shutdown()
        self.default.shutdown()


def test_the_rollouter_streams_groups_through_a_weight_sync_and_a_checkpoint(setup, other_weights):
    cfg, tokenizer, model, engine, model_eos = setup
    run = FasyncConfig.model_validate({
        "mode": "fully_async", "model": {"path": cfg.model.path}, "data": {"task": "copy", "length": 1},
        "rollout": {"engine": "vllm", "batch_size": 2, "n_samples_per_prompt": 4, "max_new_tokens": 16},
        "train": {"global_batch_size": 8, "micro_batch_size": 8},
        # A queue long enough that admission goes on generating while the test takes a few drains.
        "async": {"partial_rollout": True, "max_weight_staleness": None, "max_concurrent_samples": 16,
                  "max_queue_size": 64},
    })
    models = {0: model, 1: other_weights}
    first_engine = LocalEngine(engine)
    first = Rollouter(resolve(run), [first_engine], build_factory(resolve(run)))

    async def until_tokens_in_flight():
        deadline = time.monotonic() + 60
        while max(held_tokens(engine).values(), default=0) < 2:
            assert time.monotonic() < deadline, "nothing in flight"
            await asyncio.sleep(0.005)

    async def before_the_kill():
        running = asyncio.create_task(first.run())
        taken = []
        for drain in range(2):
            groups, _ = (await first.take(2, train_version=drain))
            taken += groups
            first.report_trained([g.group_id for g in groups], 8, 8)
            if drain == 0:
                await until_tokens_in_flight()
                served = await first.update_weights([other_weights.state_dict()], 1)
                assert [version for version, _ in served] == [1]
        await until_tokens_in_flight()
        snapshot = unpack(await first.snapshot())
        await first.take(2, train_version=2)  # lost with the killed process
        await first.stop()
        await running
        return taken, snapshot

    second_engine = LocalEngine(engine)
    try:
        taken, snapshot = asyncio.run(before_the_kill())
        first_engine.close()  # once its last take_ended has returned
        engine.take_ended()  # what the stop aborted, if that take_ended did not take it: the killed process's
        finished = [req for group in taken + snapshot["waiting"] for req in group.requests]
        assert_logprobs_are_their_versions(models, finished)
        assert first.resumed_groups > 0, "no completion went on from its prefix after the sync"
        partial = {req.request_id: len(req.output_ids) for group in snapshot["in_flight"] for req in group.requests
                   if req.output_ids and not req.finished}
        assert partial, "the snapshot caught no request part-way through its generation"

        second = Rollouter(resolve(run), [second_engine], build_factory(resolve(run)))

        async def after_the_resume():
            await second.restore(pack(snapshot))
            running = asyncio.create_task(second.run())
            resumed = []
            while not set(partial) <= {req.request_id for group in resumed for req in group.requests}:
                groups, _ = (await second.take(2, train_version=2))
                second.report_trained([g.group_id for g in groups], 8, 8)
                resumed += groups
            await second.stop()
            await running
            return resumed

        resumed = asyncio.run(after_the_resume())
    finally:
        first_engine.close()
        second_engine.close()
        engine.take_ended()
        engine.load_weights(model.state_dict(), version=0)
    first_sent = {}
    for request_id, had in second_engine.submitted:
        first_sent.setdefault(request_id, had)
    assert all(first_sent[request_id] == had for request_id, had in partial.items())
    assert_logprobs_are_their_versions(models, [req for group in resumed for req in group.requests])
    assert all(req.finished for group in resumed for req in group.requests)
    # Completions with tokens of both versions: taken, queued at the snapshot or finished after the resume.
    assert any(set(req.token_versions) == {0, 1} for group in taken + snapshot["waiting"] + resumed
               for req in group.requests)
    assert second.ledger.balanced


def test_the_rollouter_keeps_streamed_requests_in_the_engine_through_a_weight_sync(setup, other_weights, monkeypatch):
    cfg, tokenizer, model, engine, model_eos = setup
    run = FasyncConfig.model_validate({
        "mode": "fully_async", "model": {"path": cfg.model.path}, "data": {"task": "copy", "length": 1},
        "rollout": {"engine": "vllm", "batch_size": 2, "n_samples_per_prompt": 4, "max_new_tokens": 16},
        "train": {"global_batch_size": 8, "micro_batch_size": 8},
        "async": {"partial_rollout": True, "pause_mode": "keep", "max_weight_staleness": None,
                  "max_concurrent_samples": 16, "max_queue_size": 64},
    })
    assert resolve(run).derived.keeps_kv_at_sync
    monkeypatch.setattr(engine, "keeps_kv", True)  # as the run's engine actor builds it
    local = LocalEngine(engine)
    rollouter = Rollouter(resolve(run), [local], build_factory(resolve(run)))

    async def through_a_sync():
        running = asyncio.create_task(rollouter.run())
        groups, _ = (await rollouter.take(2, train_version=0))
        rollouter.report_trained([g.group_id for g in groups], 8, 8)
        deadline = time.monotonic() + 60
        while max(held_tokens(engine).values(), default=0) < 2:
            assert time.monotonic() < deadline, "nothing in flight"
            await asyncio.sleep(0.005)
        served = await rollouter.update_weights([other_weights.state_dict()], 1)
        assert [version for version, _ in served] == [1]
        taken = []
        for drain in range(1, 6):
            groups, _ = (await rollouter.take(2, train_version=drain))
            rollouter.report_trained([g.group_id for g in groups], 8, 8)
            taken += groups
        await rollouter.stop()
        await running
        return taken

    try:
        taken = asyncio.run(through_a_sync())
    finally:
        local.close()
        engine.take_ended()
        engine.load_weights(model.state_dict(), version=0)
    finished = [req for group in taken for req in group.requests]
    assert_logprobs_keep_the_old_kv({0: model, 1: other_weights}, finished)
    assert any(set(req.token_versions) == {0, 1} for req in finished), "no completion spanned the sync"
    assert rollouter.resumed_groups > 0
    # Nothing was aborted and submitted again: each request reached the engine once, with no tokens yet.
    assert sorted(local.submitted) == sorted({(request_id, 0) for request_id, _ in local.submitted})
    assert rollouter.ledger.balanced
