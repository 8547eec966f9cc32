"""The embedded model, its tokenizer, and the shared scoring functions.

The tests that compare two computations of the same logits (padded against alone, cached against full,
chunked scores against a log-softmax) are about the algorithm, so they run the model in float64
(`ALGORITHM_TOLERANCE`, as in test_scoring.py): in fp32 the sides differ by the rounding of whichever
matmul and reduction kernels the CPU picks.
"""

import math

import pytest
import torch

from fasync.config.schema import DataConfig, ModelConfig
from fasync.model import CharTokenizer, build_model, build_tokenizer, sampling_logprobs, token_logprobs
from fasync.model.tokenizer import TEXT_ALPHABET

torch.set_num_threads(1)

TOKENIZER = CharTokenizer("0123456789+=")
# float64 reorderings cost ~1e-15 relative on values of order 1; a wrong mask, position or cache row moves
# values by more than 1e-3.
ALGORITHM_TOLERANCE = dict(atol=1e-10, rtol=1e-10)


def tiny(seed=0, **overrides):
    cfg = ModelConfig(**{"n_layers": 2, "d_model": 32, "n_heads": 4, "max_seq_len": 32, **overrides})
    return build_model(cfg, TOKENIZER, seed=seed).eval()


def left_padded(rows: list[list[int]], pad: int = 0):
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_forward_shape_and_dtype():
    model = tiny()
    logits = model(torch.randint(0, TOKENIZER.vocab_size, (3, 7)))
    assert logits.shape == (3, 7, TOKENIZER.vocab_size)
    assert logits.dtype == torch.float32
    bf16 = tiny(dtype="bfloat16")
    assert bf16(torch.zeros(1, 4, dtype=torch.long)).dtype == torch.bfloat16


def test_same_seed_same_weights_and_global_rng_untouched():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = tiny(seed=1), tiny(seed=1), tiny(seed=2)
    assert torch.rand(1) == expected_next
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.token_embedding.weight, c.token_embedding.weight)


def test_n_heads_must_divide_d_model():
    with pytest.raises(ValueError, match="divisible"):
        tiny(d_model=30, n_heads=4)


def test_left_padding_does_not_change_the_real_tokens_logits():
    model = tiny().double()
    rows = [[1, 5, 6, 7, 8, 9], [1, 4, 3]]
    ids, mask, pos = left_padded(rows)
    batched = model(ids, attention_mask=mask, position_ids=pos)
    for i, row in enumerate(rows):
        alone = model(torch.tensor([row]))
        torch.testing.assert_close(batched[i, -len(row):], alone[0], **ALGORITHM_TOLERANCE)


def test_kv_cache_decoding_equals_full_forward():
    model = tiny().double()
    rows = [[1, 5, 6, 7, 8, 9, 3, 4, 5, 6], [1, 4, 3, 10, 11, 12, 13, 5]]
    prefix = 4
    ids, mask, pos = left_padded(rows)
    full = model(ids, attention_mask=mask, position_ids=pos)
    start = ids.shape[1] - (len(rows[1]) - prefix)  # the second row keeps `prefix` real tokens in the prefill
    cache = model.new_cache(len(rows), ids.shape[1])
    steps = [model(ids[:, :start], attention_mask=mask[:, :start], position_ids=pos[:, :start], cache=cache)]
    for t in range(start, ids.shape[1]):
        steps.append(model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], position_ids=pos[:, t:t + 1],
                           cache=cache))
    incremental = torch.cat(steps, dim=1)
    real = mask.bool()
    torch.testing.assert_close(incremental[real], full[real], **ALGORITHM_TOLERANCE)
    assert cache.length == ids.shape[1]


def test_char_tokenizer_round_trip_and_prompt_format():
    text = "120+034=0154"
    ids = TOKENIZER.encode(text)
    assert len(ids) == len(text) and min(ids) >= 3
    assert TOKENIZER.decode(ids) == text
    assert TOKENIZER.decode([TOKENIZER.bos_id, *ids, TOKENIZER.eos_id, TOKENIZER.pad_id]) == text
    assert TOKENIZER.format_prompt("12=") == [TOKENIZER.bos_id, *TOKENIZER.encode("12=")]
    assert (TOKENIZER.pad_id, TOKENIZER.bos_id, TOKENIZER.eos_id) == (0, 1, 2)
    assert TOKENIZER.vocab_size == 15 and TOKENIZER.stop_token_ids == (TOKENIZER.eos_id,)
    with pytest.raises(ValueError, match=r"'x' \(U\+0078, character 2 of the text\) is not in"):
        TOKENIZER.encode("1x")


def test_build_tokenizer_sizes_the_alphabet_to_the_data():
    task = build_tokenizer(ModelConfig(), DataConfig(task="add"))
    text = build_tokenizer(ModelConfig(), DataConfig(path="problems.jsonl"))
    assert task.vocab_size == 15
    assert text.vocab_size == 3 + len(TEXT_ALPHABET)
    sentence = "What is \\boxed{1/2}?\n"
    assert text.decode(text.encode(sentence)) == sentence


def test_token_logprobs_of_a_uniform_model():
    model = tiny().double()
    for parameter in model.parameters():
        torch.nn.init.zeros_(parameter)
    ids = torch.tensor([[1, 4, 5, 6]])
    mask = torch.ones_like(ids)
    logprobs, entropy = token_logprobs(model, ids, mask, mask.cumsum(-1) - 1)
    vocab = TOKENIZER.vocab_size
    assert logprobs.shape == entropy.shape == (1, 3)
    torch.testing.assert_close(logprobs, torch.full((1, 3), -math.log(vocab), dtype=torch.float64),
                               **ALGORITHM_TOLERANCE)
    torch.testing.assert_close(entropy, torch.full((1, 3), math.log(vocab), dtype=torch.float64),
                               **ALGORITHM_TOLERANCE)


def test_token_logprobs_score_the_next_token_under_the_tempered_softmax():
    model = tiny().double()
    ids = torch.tensor([[1, 4, 5, 6, 7]])
    mask = torch.ones_like(ids)
    logprobs, entropy = token_logprobs(model, ids, mask, mask.cumsum(-1) - 1, temperature=0.5)
    expected = (model(ids)[0, :-1] / 0.5).log_softmax(-1)
    torch.testing.assert_close(logprobs[0], expected[torch.arange(4), ids[0, 1:]], **ALGORITHM_TOLERANCE)
    torch.testing.assert_close(entropy[0], -(expected.exp() * expected).sum(-1), **ALGORITHM_TOLERANCE)


def test_sampling_logprobs_temperature_and_nucleus_by_hand():
    # sampling_logprobs works in fp32 (as the engines do). The probabilities here are built from three
    # values of order 1 through one log-softmax and exp: a few fp32 ulps (6e-8 each at 0.5) against
    # assert_close's fp32 default (atol 1e-5, rtol 1.3e-6), which a cut or unrenormalised nucleus (>= 0.1) exceeds.
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log()
    torch.testing.assert_close(sampling_logprobs(logits, 1.0).exp(), probs)
    root = probs.sqrt()
    torch.testing.assert_close(sampling_logprobs(logits, 2.0).exp(), root / root.sum())
    # top_p 0.7: 0.5 alone falls short, 0.5 + 0.3 reaches it, so 0.2 is cut and the rest renormalised.
    torch.testing.assert_close(sampling_logprobs(logits, 1.0, 0.7).exp(), torch.tensor([0.625, 0.375, 0.0]))
    # The most likely token always stays, however small top_p is.
    torch.testing.assert_close(sampling_logprobs(logits, 1.0, 0.1).exp(), torch.tensor([1.0, 0.0, 0.0]))
    # Greedy decoding is scored under the untempered distribution.
    torch.testing.assert_close(sampling_logprobs(logits, 0.0, 0.5).exp(), probs)


def test_sampling_logprobs_top_k_then_top_p_by_hand():
    # Same fp32 tolerance as above. Four tokens 0.4, 0.3, 0.2, 0.1: top_k 3 keeps 0.9 of the mass.
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits = probs.log()
    torch.testing.assert_close(sampling_logprobs(logits, 1.0, top_k=3).exp(),
                               torch.tensor([0.4, 0.3, 0.2, 0.0]) / 0.9)
    # Then top_p 0.7 within the kept three (4/9, 3/9, 2/9): 4/9 falls short, 7/9 reaches it.
    torch.testing.assert_close(sampling_logprobs(logits, 1.0, 0.7, top_k=3).exp(),
                               torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))
    # k at least the vocabulary cuts nothing; a tie at the k-th logit keeps both tokens.
    torch.testing.assert_close(sampling_logprobs(logits, 1.0, top_k=4).exp(), probs)
    tied = torch.tensor([0.4, 0.2, 0.2, 0.2]).log()
    torch.testing.assert_close(sampling_logprobs(tied, 1.0, top_k=2).exp(), torch.tensor([0.4, 0.2, 0.2, 0.2]))
