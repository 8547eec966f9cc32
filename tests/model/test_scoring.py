"""Chunked scoring (fasync.model.scoring) against the full-vocabulary computation it replaces: the same
logprobs, entropies and gradients, completion tokens only, and no entropy graph unless asked.

These tests are about the algorithm (which positions, which chunks, which gradient formula), so both sides
run in float64. In fp32 the two sides differ by one ulp of the logits' magnitude (9.5e-7 at logprobs near
-10), depending on which matmul and reduction kernels the CPU picks: an fp32 tolerance tight enough to mean
anything failed on an AMD EPYC. In float64 the same reordering costs about 1e-15 relative, so
`ALGORITHM_TOLERANCE` leaves five orders of magnitude of headroom on any CPU while still catching a wrong
position, chunk boundary or gradient term (each of those moves values by more than 1e-3).
"""

import pytest
import torch

from fasync.config.schema import ModelConfig
from fasync.model import CharTokenizer, build_model, token_logprobs
from fasync.model.scoring import ScoreRequest, next_token_request
from fasync.rollout.types import Sample
from fasync.train.batching import collate

torch.set_num_threads(1)
TOKENIZER = CharTokenizer("0123456789+=")
ALGORITHM_TOLERANCE = dict(atol=1e-10, rtol=1e-10)


def full_vocabulary_logprobs(model, ids, mask, positions, temperature):
    """What fasync computed before chunking: the logits of every position, log-softmax, exp, entropy."""
    logits = model(ids, attention_mask=mask, position_ids=positions)
    logprobs = (logits[:, :-1] / temperature).log_softmax(-1)
    chosen = logprobs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return chosen, -(logprobs.exp() * logprobs).sum(-1)


def scrambled_model(seed=0):
    model = build_model(ModelConfig(n_layers=2, d_model=32, n_heads=4, max_seq_len=32), TOKENIZER, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return model.double()


def batch_inputs(seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, TOKENIZER.vocab_size, (3, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 5, None])
def test_chunked_scores_and_their_gradients_equal_the_full_vocabulary_ones(monkeypatch, temperature, chunk):
    from fasync.model import scoring

    if chunk is not None:  # `chunk` positions at a time
        monkeypatch.setattr(scoring, "LOGIT_CHUNK_ELEMENTS", chunk * TOKENIZER.vocab_size)
    ids, mask, positions = batch_inputs()
    model = scrambled_model()
    expected_logp, expected_entropy = full_vocabulary_logprobs(model, ids, mask, positions, temperature)
    (expected_logp.sum() + expected_entropy.sum()).backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    request = next_token_request(ids, temperature, entropy_grad=True)
    hidden_scores = model(ids, attention_mask=mask, position_ids=positions, score=request)
    logp, entropy = (values.view(3, 11) for values in hidden_scores)
    torch.testing.assert_close(logp, expected_logp, **ALGORITHM_TOLERANCE)
    torch.testing.assert_close(entropy, expected_entropy, **ALGORITHM_TOLERANCE)
    (logp.sum() + entropy.sum()).backward()
    # Gradients sum 33 positions' terms in another order (chunk by chunk): float64 rounding only.
    for param, expected in zip(model.parameters(), expected_grads):
        torch.testing.assert_close(param.grad, expected, **ALGORITHM_TOLERANCE)


@pytest.mark.parametrize("chunk", [1, 4])
def test_small_chunks_give_the_same_scores_as_one_chunk(chunk):
    from fasync.model import scoring

    ids, mask, positions = batch_inputs(1)
    model = scrambled_model(1)
    hidden = torch.randn(3, 12, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64,
                         requires_grad=True)
    request = next_token_request(ids, 1.0, entropy_grad=True)
    whole = scoring.score_hidden(hidden, model.token_embedding.weight, None, request)
    chunked = scoring.score_hidden(hidden, model.token_embedding.weight, None, request, chunk)
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, **ALGORITHM_TOLERANCE)
    (chunked[0].sum() + chunked[1].sum()).backward()
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0


def test_token_logprobs_equal_the_full_vocabulary_computation():
    ids, mask, positions = batch_inputs(3)
    model = scrambled_model(3)
    with torch.no_grad():
        got = token_logprobs(model, ids, mask, positions, 0.5)
        expected = full_vocabulary_logprobs(model, ids, mask, positions, 0.5)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, **ALGORITHM_TOLERANCE)


def test_a_micro_batch_scores_its_completion_tokens_only_padded_or_packed():
    model = scrambled_model(4)
    samples = [Sample(group_id=0, prompt_ids=[1, 5, 6, 11], output_ids=[7, 8, 2], behaviour_logprobs=[0.0] * 3,
                      token_versions=[0] * 3, reward=0.0),
               Sample(group_id=0, prompt_ids=[1, 9, 11], output_ids=[4], behaviour_logprobs=[0.0],
                      token_versions=[0], reward=0.0)]
    expected = []
    for sample in samples:  # each sequence alone, every position scored
        ids = torch.tensor([sample.prompt_ids + sample.output_ids])
        logp, _ = full_vocabulary_logprobs(model, ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None], 1.0)
        expected.append(logp[0, len(sample.prompt_ids) - 1:])
    for packed in (False, True):
        batch = collate(samples, TOKENIZER.pad_id, packed=packed)
        request = batch.request(1.0)
        assert request.positions.numel() == 4  # four completion tokens, no prompt or padding position
        with torch.no_grad():
            logp = batch.scored(model(batch.input_ids, position_ids=batch.position_ids, score=request)[0])
        for row, reference in enumerate(expected):
            torch.testing.assert_close(logp[row][batch.completion_mask[row]], reference, **ALGORITHM_TOLERANCE)


def test_entropy_keeps_no_graph_unless_its_gradient_is_asked_for():
    ids, mask, positions = batch_inputs()
    model = scrambled_model()
    for entropy_grad in (False, True):
        request = ScoreRequest(torch.tensor([0, 1, 2]), ids[0, 1:4], 1.0, entropy_grad)
        logp, entropy = model(ids, attention_mask=mask, position_ids=positions, score=request)
        assert logp.requires_grad
        assert entropy.requires_grad is entropy_grad
