"""The vLLM engine on a CUDA GPU: skipped without one (and without a CUDA build of vLLM), as everywhere this
project has run so far (docs/gpu.md). The same checks as tests/rollout/test_vllm_engine.py, on the GPU."""

import pytest
import torch
from tiny_models import write_vllm_llama

pytest.importorskip("vllm")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from fasync.config.schema import FasyncConfig  # noqa: E402
from fasync.model import build_model, build_tokenizer, token_logprobs  # noqa: E402
from fasync.rollout.build import build_engine  # noqa: E402
from fasync.rollout.types import Generation, SamplingParams  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.vllm]
PROMPTS = ["12+3", "7", "what is 4+4?"]


def test_generation_and_a_weight_push_on_the_gpu(tmp_path):
    write_vllm_llama(tmp_path / "a")
    write_vllm_llama(tmp_path / "b", seed=1)
    cfg = FasyncConfig.model_validate({"model": {"path": str(tmp_path / "a"), "dtype": "float32"},
                                       "rollout": {"engine": "vllm"},
                                       "resources": {"num_gpus": 1, "gpus_per_engine": 1}})
    tokenizer = build_tokenizer(cfg.model, cfg.data)
    engine = build_engine(cfg, tokenizer)
    other = build_model(cfg.model.model_copy(update={"path": str(tmp_path / "b")}), tokenizer, seed=0).eval()
    assert engine.load_weights(other.state_dict(), version=2) == 2
    out = engine.generate([Generation(i, tokenizer.format_prompt(p)) for i, p in enumerate(PROMPTS)],
                          SamplingParams(max_new_tokens=6))
    for gen in out:
        ids = torch.tensor([gen.prompt_ids + gen.output_ids])
        mask = torch.ones_like(ids)
        with torch.no_grad():
            expected, _ = token_logprobs(other, ids, mask, mask.cumsum(-1) - 1)
        # Different kernels on the GPU: close, not equal. 2e-2 is a margin for another implementation's GPU
        # kernels, not an fp32 ulp bound (the CPU-side tolerance audit could not run this test: no GPU).
        torch.testing.assert_close(torch.tensor(gen.logprobs), expected[0, len(gen.prompt_ids) - 1:],
                                   atol=2e-2, rtol=0)
        assert gen.token_versions == [2] * len(gen.output_ids)
