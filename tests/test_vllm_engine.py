"""The vLLM engine on vLLM's CPU build (`make test-vllm`): one engine for the module, on a tiny Llama whose
head size (64) the CPU attention supports. Skipped where vllm is not installed (`make test`)."""

import json
import threading

import pytest
import torch
from test_hf_model import write_tiny_llama

from fasync.config.schema import FasyncConfig
from fasync.model import build_model, build_tokenizer, token_logprobs
from fasync.rollout.build import build_engine
from fasync.rollout.hf_engine import HFEngine
from fasync.rollout.types import Generation, SamplingParams

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

PROMPTS = ["12+3", "7", "what is 4+4?", "ab", "99", "x+y", "3", "hello"]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("these tests run vLLM's CPU build (tests/test_vllm_gpu.py runs a CUDA one)")
    directory = tmp_path_factory.mktemp("tiny-llama-vllm")
    write_tiny_llama(directory, hidden_size=128, heads=2)
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
    write_tiny_llama(tmp_path, hidden_size=128, heads=2, seed=1)
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
