"""The torch rollout engine: sampling, stopping, partial resume, control calls, and logprobs that
match the trainer's."""

import threading
import time

import pytest
import torch

from fasync.config.schema import FasyncConfig
from fasync.model import build_tokenizer, token_logprobs
from fasync.model.policy import sampling_logprobs
from fasync.rollout import hf_engine
from fasync.rollout.build import build_engine
from fasync.rollout.types import Generation, SamplingParams

torch.set_num_threads(1)

CFG = FasyncConfig.model_validate({"model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "max_seq_len": 24}})
TOKENIZER = build_tokenizer(CFG.model, CFG.data)
PROMPTS = ["123456=", "9=", "4444+1=", "31="]
LOGIT_BOUND = 32.0
"""The scrambled weights keep every logit below this (19 measured; checked below)."""
LOGIT_ULP = torch.finfo(torch.float32).eps * LOGIT_BOUND / 2
"""The spacing of fp32 values just below LOGIT_BOUND: 2**-23 * 16 = 1.9e-6."""
LOGPROB_TOLERANCE = dict(atol=32 * LOGIT_ULP, rtol=0)
"""The engine computes its fp32 logits in other shapes than the reference it is compared with (prefill
widths, a KV cache against a full forward, left against right padding), so the CPU's kernels round them
differently, by a few ulps of the largest logit: the logprobs differed by up to 2.8 LOGIT_ULPs (5.3e-6) on
an AMD EPYC with 1 or 2 threads. 32 ulps (6.1e-5) leave room for other CPUs' kernels; a wrong token,
position, temperature or nucleus moves a logprob by more than 1e-2."""


def scrambled(model, seed):
    """Unit-variance matrices (norms kept), so that greedy outputs vary from token to token: the
    small initialisation repeats one token."""
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(t.shape, generator=generator) if t.dim() == 2 else t
            for name, t in model.state_dict().items()}


@pytest.fixture
def engine():
    engine = build_engine(CFG, TOKENIZER)
    engine.load_weights(scrambled(engine.model, 0), version=0)
    return engine


def requests(prompts=PROMPTS, copies=1):
    ids = [TOKENIZER.format_prompt(p) for p in prompts for _ in range(copies)]
    return [Generation(request_id=i, prompt_ids=p) for i, p in enumerate(ids)]


def greedy_reference(model, prompt_ids, steps):
    """Greedy decoding the slow way: a full forward over the whole sequence for every token."""
    ids = list(prompt_ids)
    for _ in range(steps):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt_ids):]


def trainer_logprobs(engine, generations, temperature=1.0):
    """The trainer's view: right-padded prompt + output, positions from the mask, token_logprobs."""
    rows = [g.prompt_ids + g.output_ids for g in generations]
    width = max(map(len, rows))
    ids = torch.tensor([r + [TOKENIZER.pad_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        logprobs, _ = token_logprobs(engine.model, ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), temperature)
    return [logprobs[i, len(g.prompt_ids) - 1: len(rows[i]) - 1] for i, g in enumerate(generations)]


def test_greedy_is_deterministic_and_equals_full_forward_decoding(engine):
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    first = engine.generate(requests(), params)
    assert first == engine.generate(requests(), params)
    assert len({token for gen in first for token in gen.output_ids}) > 3
    for gen in first:
        assert gen.output_ids == greedy_reference(engine.model, gen.prompt_ids, 6)
        assert gen.finish_reason == "length" and gen.token_versions == [0] * 6


def test_max_new_tokens_without_stop_tokens(engine):
    out = engine.generate(requests(copies=3), SamplingParams(max_new_tokens=5))
    assert [len(g.output_ids) for g in out] == [5] * 12
    assert all(g.finish_reason == "length" and len(g.logprobs) == 5 for g in out)


def test_stop_tokens_end_a_completion_and_are_kept(engine):
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    free = engine.generate(requests(), params)[0].output_ids
    stop = free[2]
    cut = free.index(stop) + 1
    stopped = engine.generate(requests(), SamplingParams(8, 0.0, stop_token_ids=(stop,)))[0]
    assert stopped.output_ids == free[:cut] and stopped.finish_reason == "stop"
    everything = tuple(range(TOKENIZER.vocab_size))
    out = engine.generate(requests(), SamplingParams(8, stop_token_ids=everything))
    assert all(len(g.output_ids) == 1 and g.finish_reason == "stop" for g in out)


def test_finished_requests_pass_through_and_spent_budgets_end(engine):
    done = Generation(0, [1, 4], output_ids=[5], logprobs=[-1.0], token_versions=[0], finish_reason="stop")
    spent = Generation(1, [1, 4], output_ids=[5, 6], logprobs=[-1.0, -1.0], token_versions=[0, 0],
                       finish_reason="abort")
    out = engine.generate([done, spent], SamplingParams(max_new_tokens=2))
    assert out[0] == done
    assert out[1].output_ids == [5, 6] and out[1].finish_reason == "length"


def test_generation_stops_at_the_models_context_length(engine):
    long_prompt = [TOKENIZER.bos_id] + TOKENIZER.encode("1234567890123456789=")  # 21 of 24 positions
    full = Generation(1, [TOKENIZER.bos_id] + TOKENIZER.encode("12345678901234567890123"))
    out = engine.generate([Generation(0, long_prompt), full], SamplingParams(max_new_tokens=10))
    assert len(out[0].output_ids) == 3 and out[0].finish_reason == "length"
    assert out[1].output_ids == [] and out[1].finish_reason == "length"


def test_rows_near_the_context_length_decode_beside_rows_with_more_room(engine):
    # The call decodes for the short row's budget; the long row is done after 3 and must not run off the model.
    long_prompt = [TOKENIZER.bos_id] + TOKENIZER.encode("1234567890123456789=")
    out = engine.generate([Generation(0, long_prompt), *requests(["9="])], SamplingParams(max_new_tokens=10))
    assert [len(g.output_ids) for g in out] == [3, 10]


def test_partial_resume_counts_prefix_and_records_versions(engine, monkeypatch):
    greedy = SamplingParams(max_new_tokens=7, temperature=0.0)
    whole = engine.generate(requests(), greedy)
    sampled = []

    def abort_after_third_token(*args):
        sampled.append(1)
        if len(sampled) == 3:  # checked before the fourth is sampled, which never is
            engine.abort()
        return sampling_logprobs(*args)

    monkeypatch.setattr(hf_engine, "sampling_logprobs", abort_after_third_token)
    partial = engine.generate(requests(), greedy)
    monkeypatch.undo()
    assert all(g.finish_reason == "abort" and len(g.output_ids) == 3 for g in partial)

    engine.load_weights(engine.model.state_dict(), version=1)
    resumed = engine.generate(partial, greedy)
    for full, res in zip(whole, resumed):
        assert res.output_ids == full.output_ids and res.finish_reason == "length"
        assert res.token_versions == [0, 0, 0, 1, 1, 1, 1]
        torch.testing.assert_close(torch.tensor(res.logprobs), torch.tensor(full.logprobs), **LOGPROB_TOLERANCE)


def test_a_token_budget_slices_a_completion_without_changing_it(engine):
    greedy = SamplingParams(max_new_tokens=7, temperature=0.0)
    whole = engine.generate(requests(), greedy)
    sliced, lengths = requests(), []
    while not all(g.finished for g in sliced):
        sliced = engine.generate(sliced, greedy, token_budget=3)
        lengths.append([len(g.output_ids) for g in sliced])
        assert all(g.finish_reason is None for g in sliced) or all(g.finish_reason == "length" for g in sliced)
    assert lengths == [[3] * 4, [6] * 4, [7] * 4]
    for full, part in zip(whole, sliced):
        assert part.output_ids == full.output_ids and part.token_versions == [0] * 7
        torch.testing.assert_close(torch.tensor(part.logprobs), torch.tensor(full.logprobs), **LOGPROB_TOLERANCE)


def forward_widths(engine):
    """The number of new tokens of every forward pass the model makes (1: a decode step)."""
    widths = []
    hook = engine.model.register_forward_hook(lambda _module, args, _out: widths.append(args[0].shape[1]))
    return widths, hook


def test_a_continued_call_reuses_the_prefix_and_prefills_only_new_rows(engine):
    greedy = SamplingParams(max_new_tokens=7, temperature=0.0)
    whole = engine.generate(requests(PROMPTS + ["77=", "5="]), greedy)
    started = engine.generate(requests(), greedy, token_budget=3)
    widths, hook = forward_widths(engine)
    continued = engine.generate(started, greedy, token_budget=2)
    assert widths == [1, 1]  # no prefill: the last token of each context, then one decode step
    widths.clear()
    joined = engine.generate(continued + requests(["77=", "5="]), greedy)
    hook.remove()
    assert widths[0] == len(TOKENIZER.format_prompt("77=")) - 1 and widths[1:] == [1] * 7
    assert [g.output_ids for g in joined] == [g.output_ids for g in whole]
    for full, part in zip(whole, joined):
        torch.testing.assert_close(torch.tensor(part.logprobs), torch.tensor(full.logprobs), **LOGPROB_TOLERANCE)


def test_prompts_of_very_different_lengths_are_prefilled_at_their_own_widths(engine):
    greedy = SamplingParams(max_new_tokens=5, temperature=0.0)
    prompts = ["9=", "123456789012=", "31="]
    alone = [engine.generate(requests([prompt]), greedy)[0] for prompt in prompts]
    widths, hook = forward_widths(engine)
    together = engine.generate(requests(prompts), greedy)
    hook.remove()
    short, long = (len(TOKENIZER.format_prompt(p)) - 1 for p in ("31=", "123456789012="))
    assert widths == [short, long] + [1] * 5
    assert [g.output_ids for g in together] == [g.output_ids for g in alone]
    for one, batched in zip(alone, together):
        torch.testing.assert_close(torch.tensor(batched.logprobs), torch.tensor(one.logprobs), **LOGPROB_TOLERANCE)


def test_new_weights_prefill_the_prefix_again(engine):
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    started = engine.generate(requests(), greedy, token_budget=3)
    engine.load_weights(scrambled(engine.model, 1), version=1)
    widths, hook = forward_widths(engine)
    resumed = engine.generate(started, greedy)
    hook.remove()
    assert widths[0] > 1
    for gen in resumed:
        expected = gen.output_ids[:3] + greedy_reference(engine.model, gen.prompt_ids + gen.output_ids[:3], 3)
        assert gen.output_ids == expected and gen.token_versions == [0, 0, 0, 1, 1, 1]


def test_a_stop_inside_the_budget_finishes_the_request(engine):
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    free = engine.generate(requests(), greedy)[0].output_ids
    stopped = engine.generate(requests(), SamplingParams(8, 0.0, stop_token_ids=(free[1],)), token_budget=4)[0]
    assert stopped.output_ids == free[: free.index(free[1]) + 1] and stopped.finish_reason == "stop"


def test_abort_only_affects_calls_already_made(engine):
    engine.abort()
    out = engine.generate(requests(), SamplingParams(max_new_tokens=3))
    assert all(len(g.output_ids) == 3 and g.finish_reason == "length" for g in out)


def test_pause_interrupts_blocks_and_resume_unblocks(engine):
    params = SamplingParams(max_new_tokens=8)
    first_step = threading.Event()
    release = threading.Event()

    def hold_after_prefill(*_):
        first_step.set()
        release.wait()

    hook = engine.model.register_forward_hook(hold_after_prefill)
    results = {}
    in_flight = threading.Thread(target=lambda: results.update(first=engine.generate(requests(), params)))
    in_flight.start()
    assert first_step.wait(10)
    pauser = threading.Thread(target=engine.pause)
    pauser.start()
    while engine._running.is_set():  # until pause has flagged the engine (it then waits for the call to end)
        time.sleep(0.001)
    release.set()
    pauser.join(10)
    in_flight.join(10)
    hook.remove()
    assert not pauser.is_alive() and not in_flight.is_alive()
    assert all(g.finish_reason == "abort" and len(g.output_ids) <= 1 for g in results["first"])

    blocked = threading.Thread(target=lambda: results.update(second=engine.generate(results["first"], params)))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive() and "second" not in results
    engine.resume()
    blocked.join(10)
    assert all(len(g.output_ids) == 8 and g.finish_reason == "length" for g in results["second"])


def test_load_weights_changes_the_policy_and_the_version(engine):
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    before = engine.generate(requests(), params)
    other = build_engine(CFG, TOKENIZER)
    other.load_weights(scrambled(other.model, 1), version=0)
    engine.load_weights(other.model.state_dict(), version=3)
    after = engine.generate(requests(), params)
    assert engine.weight_version == 3 and all(g.token_versions == [3] * 4 for g in after)
    assert [g.output_ids for g in after] == [g.output_ids for g in other.generate(requests(), params)]
    assert [g.output_ids for g in after] != [g.output_ids for g in before]


def test_logprobs_equal_the_trainers_at_temperature_one(engine):
    """Prompts of different lengths are left-padded together in the engine and right-padded in the trainer."""
    out = engine.generate(requests(copies=4), SamplingParams(max_new_tokens=6, stop_token_ids=(TOKENIZER.eos_id,)))
    assert len({len(g.prompt_ids) for g in out}) == 3
    for gen, recomputed in zip(out, trainer_logprobs(engine, out)):
        torch.testing.assert_close(torch.tensor(gen.logprobs), recomputed, **LOGPROB_TOLERANCE)


def test_tempered_top_p_logprobs_are_the_renormalised_distribution(engine):
    temperature, top_p = 0.7, 0.8
    out = engine.generate(requests(copies=4), SamplingParams(max_new_tokens=5, temperature=temperature, top_p=top_p))
    for gen in out:
        ids = torch.tensor([gen.prompt_ids + gen.output_ids])
        with torch.no_grad():
            logits = engine.model(ids)[0, len(gen.prompt_ids) - 1: -1]
        for position, token in enumerate(gen.output_ids):
            probs = (logits[position] / temperature).softmax(-1).tolist()
            nucleus, mass = [], 0.0
            for candidate in sorted(range(len(probs)), key=lambda i: -probs[i]):
                if mass >= top_p:
                    break
                nucleus.append(candidate)
                mass += probs[candidate]
            assert token in nucleus
            expected = torch.tensor(probs[token] / mass).log()
            torch.testing.assert_close(torch.tensor(gen.logprobs[position]), expected, **LOGPROB_TOLERANCE)


def test_top_k_samples_only_the_k_most_likely_and_reports_their_renormalised_logprobs(engine):
    temperature, top_k = 0.7, 3
    out = engine.generate(requests(copies=4), SamplingParams(max_new_tokens=5, temperature=temperature, top_k=top_k))
    for gen in out:
        ids = torch.tensor([gen.prompt_ids + gen.output_ids])
        with torch.no_grad():
            logits = engine.model(ids)[0, len(gen.prompt_ids) - 1: -1]
        for position, token in enumerate(gen.output_ids):
            probs = (logits[position] / temperature).softmax(-1)
            kept = probs.topk(top_k).indices.tolist()
            assert token in kept
            expected = (probs[token] / probs[kept].sum()).log()
            torch.testing.assert_close(torch.tensor(gen.logprobs[position]), expected, **LOGPROB_TOLERANCE)


def test_the_scrambled_logits_stay_below_the_bound_the_tolerance_is_derived_from(engine):
    out = engine.generate(requests(copies=4), SamplingParams(max_new_tokens=7))
    with torch.no_grad():
        largest = max(float(engine.model(torch.tensor([g.prompt_ids + g.output_ids])).abs().max()) for g in out)
    assert 1.0 < largest < LOGIT_BOUND


def test_sampling_follows_the_models_distribution(engine):
    """4096 draws of a first token: frequencies within a few points of the model's probabilities."""
    out = engine.generate(requests(["12="], copies=4096), SamplingParams(max_new_tokens=1))
    counts = torch.bincount(torch.tensor([g.output_ids[0] for g in out]), minlength=TOKENIZER.vocab_size)
    with torch.no_grad():
        probs = engine.model(torch.tensor([out[0].prompt_ids]))[0, -1].softmax(-1)
    total_variation = 0.5 * (counts / 4096 - probs).abs().sum()
    assert total_variation < 0.05
