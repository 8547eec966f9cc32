"""The KV cache written in place (fasync.model.hf_cache) against transformers' `DynamicCache`, which it replaced in
the torch engine: the same generations, token for token, on left-padded prompts of different lengths.

The comparisons are about the algorithm (which positions each query sees, where each key lands), so the model
runs in float64 (`ALGORITHM_TOLERANCE`, as in test_model.py and test_scoring.py): both caches hand attention the
same keys and values, and float64 leaves only reorderings of ~1e-15 relative between two kernels' results, while a
wrong mask, position or cache row moves a logprob by more than 1e-2."""

import pytest
import torch
from tiny_models import write_tiny_llama

from fasync.model.hf import load_hf_model
from fasync.model.hf_cache import PreallocatedLayer, preallocated_cache
from fasync.rollout.hf_engine import HFEngine
from fasync.rollout.types import Generation, SamplingParams

transformers = pytest.importorskip("transformers")

torch.set_num_threads(1)

ALGORITHM_TOLERANCE = dict(atol=1e-10, rtol=1e-10)
PROMPTS = {
    "similar lengths (one prefill, left-padded)": [[1, 9, 12, 7], [1, 30, 5], [1, 18, 22, 9, 14, 11], [1, 6]],
    "very different lengths (prefilled in buckets, then merged)": [[1, 9, 12, 7, 20, 21, 5, 33, 17, 8, 13, 40],
                                                                   [1, 30], [1, 18, 22, 9], [1, 6, 11]],
}
STOPS = (2, 4)
"""The tiny Llama's stop ids: a row that stops keeps decoding beside the others until the call ends."""
PARAMS = {"greedy": SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=STOPS),
          "sampled": SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.95, stop_token_ids=STOPS)}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_llama(directory)
    return directory


def engine_pair(model_dir) -> tuple[HFEngine, HFEngine]:
    """Two float64 engines of the same scrambled weights (unit-variance matrices, so that tokens vary from step to
    step) and the same seed: the first with the in-place cache, the second with transformers' `DynamicCache`."""
    engines = []
    for _ in range(2):
        model = load_hf_model(str(model_dir), torch.float64)
        generator = torch.Generator().manual_seed(0)
        model.load_state_dict({name: torch.randn(t.shape, generator=generator, dtype=t.dtype) if t.dim() == 2 else t
                               for name, t in model.state_dict().items()})
        engines.append(HFEngine(model, pad_id=0, seed=1))
    growing = engines[1].model
    growing.new_cache = lambda batch_size, max_len: transformers.DynamicCache(config=growing.lm.config)
    return engines[0], engines[1]


def assert_same(ours: list[Generation], theirs: list[Generation]) -> None:
    assert [g.output_ids for g in ours] == [g.output_ids for g in theirs]
    assert [g.finish_reason for g in ours] == [g.finish_reason for g in theirs]
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(torch.tensor(mine.logprobs, dtype=torch.float64),
                                   torch.tensor(reference.logprobs, dtype=torch.float64), **ALGORITHM_TOLERANCE)


@pytest.mark.parametrize("prompts", PROMPTS.values(), ids=PROMPTS.keys())
@pytest.mark.parametrize("params", PARAMS.values(), ids=PARAMS.keys())
def test_generations_equal_the_growing_caches(model_dir, prompts, params):
    ours, theirs = engine_pair(model_dir)
    assert isinstance(ours.model.new_cache(1, 4).layers[0], PreallocatedLayer)
    requests = [Generation(i, p) for i, p in enumerate(prompts)]
    generated = [engine.generate(requests, params) for engine in (ours, theirs)]
    assert_same(*generated)


@pytest.mark.parametrize("params", PARAMS.values(), ids=PARAMS.keys())
def test_continued_calls_equal_the_growing_caches(model_dir, params):
    """Token budgets slice the calls, so each later call continues the rows the one before left unfinished from
    their kept keys and values, beside rows it prefills: the engine's prefix reuse, as a partial rollout resumes."""
    prompts = PROMPTS["very different lengths (prefilled in buckets, then merged)"]
    engines = engine_pair(model_dir)
    results = []
    for engine in engines:
        requests = [Generation(i, p) for i, p in enumerate(prompts)]
        sliced = engine.generate(requests[:2], params, token_budget=3)
        sliced = engine.generate(sliced + requests[2:], params, token_budget=4)
        results.append(engine.generate(sliced, params))
    assert_same(*results)


def test_each_forward_writes_its_positions_into_the_room_allocated_once(model_dir):
    model = load_hf_model(str(model_dir), torch.float64)
    cache = model.new_cache(2, 6)
    with torch.no_grad():
        model(torch.tensor([[1, 9, 12], [1, 30, 5]]), cache=cache)
        storage = [layer.keys.data_ptr() for layer in cache.layers]
        model(torch.tensor([[7], [8]]), cache=cache)
    assert [layer.keys.data_ptr() for layer in cache.layers] == storage
    assert [tuple(layer.keys.shape[2:3]) for layer in cache.layers] == [(4,)] * len(cache.layers)
    with pytest.raises(ValueError, match="holds 6 positions; 7 were written"):
        with torch.no_grad():
            model(torch.tensor([[7, 7, 7], [8, 8, 8]]), cache=cache)


def test_a_model_with_sliding_window_layers_keeps_transformers_cache():
    config = transformers.MistralConfig(num_hidden_layers=2, sliding_window=8)
    assert type(preallocated_cache(config, 16)) is transformers.DynamicCache


@pytest.mark.parametrize("params", PARAMS.values(), ids=PARAMS.keys())
def test_a_prompts_samples_share_one_prefill_and_generate_as_if_each_had_its_own(model_dir, params):
    """A prompt's samples (the same context in several rows) go through the prefill once and share its keys,
    values and logits; each row then decodes and samples on its own, exactly as if it had been prefilled alone."""
    shared, separate = engine_pair(model_dir)
    separate._prefill = separate._prefill_rows  # every row through the model, as before the sharing
    prompts = PROMPTS["similar lengths (one prefill, left-padded)"]
    requests = [Generation(i, prompts[i % 3]) for i in range(7)]  # three prompts, two or three samples each
    prefill_rows = []
    hook = shared.model.register_forward_hook(lambda _module, args, _out: prefill_rows.append(args[0].shape[0]))
    generated = [engine.generate(requests, params) for engine in (shared, separate)]
    hook.remove()
    assert prefill_rows[0] == 3 and set(prefill_rows[1:]) == {7}
    assert_same(*generated)
    assert len({tuple(g.output_ids) for g in generated[0] if g.prompt_ids == prompts[0]}) > 1 or params.temperature == 0
