"""The vLLM engine on a tiny Llama (skipped without CUDA and vllm)."""

import pytest
import torch
from test_hf_model import write_tiny_llama

from fasync.config.schema import FasyncConfig
from fasync.model import build_model, build_tokenizer, token_logprobs
from fasync.rollout.build import build_engine
from fasync.rollout.types import Generation, SamplingParams

pytest.importorskip("vllm")
if not torch.cuda.is_available():
    pytest.skip("the vLLM engine needs a CUDA GPU", allow_module_level=True)

pytestmark = pytest.mark.gpu
PROMPTS = ["12+3", "7", "what is 4+4?"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama-vllm")
    # Head size 64: every vLLM attention backend supports it.
    write_tiny_llama(directory, hidden_size=128, heads=2)
    cfg = FasyncConfig.model_validate({"model": {"path": str(directory)}, "rollout": {"engine": "vllm"},
                                       "resources": {"gpus_per_engine": 1}})
    tokenizer = build_tokenizer(cfg.model, cfg.data)
    return cfg, tokenizer, build_engine(cfg, tokenizer)


def requests(tokenizer):
    return [Generation(i, tokenizer.format_prompt(p)) for i, p in enumerate(PROMPTS)]


def greedy_reference(model, prompt_ids, steps):
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt_ids):]


def test_logprobs_match_the_trainers(setup):
    cfg, tokenizer, engine = setup
    model = build_model(cfg.model, tokenizer, seed=0).eval()
    out = engine.generate(requests(tokenizer), SamplingParams(max_new_tokens=6))
    for gen in out:
        assert gen.finish_reason == "length" and len(gen.output_ids) == len(gen.logprobs) == 6
        ids = torch.tensor([gen.prompt_ids + gen.output_ids])
        mask = torch.ones_like(ids)
        with torch.no_grad():
            expected, _ = token_logprobs(model, ids, mask, mask.cumsum(-1) - 1)
        # Different kernels on different hardware: close, not bitwise.
        torch.testing.assert_close(torch.tensor(gen.logprobs), expected[0, len(gen.prompt_ids) - 1:],
                                   atol=2e-2, rtol=0)


def test_weights_versions_and_partial_resume(setup, tmp_path):
    cfg, tokenizer, engine = setup
    write_tiny_llama(tmp_path, hidden_size=128, heads=2, seed=1)
    other = build_model(cfg.model.model_copy(update={"path": str(tmp_path)}), tokenizer, seed=0).eval()
    engine.load_weights(other.state_dict(), version=4)
    greedy = SamplingParams(max_new_tokens=3, temperature=0.0)
    first = engine.generate(requests(tokenizer), greedy)
    for gen in first:
        gen.finish_reason = None  # as if aborted by a weight sync
    resumed = engine.generate(first, SamplingParams(max_new_tokens=6, temperature=0.0))
    for gen in resumed:
        assert gen.output_ids == greedy_reference(other, gen.prompt_ids, 6)
        assert gen.token_versions == [4] * 6 and gen.finish_reason == "length"
