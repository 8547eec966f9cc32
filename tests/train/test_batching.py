"""Collation alignment, the step plan's arithmetic, and how ranks share a step."""

import pytest

from fasync.config.derived import derive
from fasync.config.schema import FasyncConfig
from fasync.rollout.types import GroupId, Sample
from fasync.train.batching import collate, plan_steps, rank_micro_batches

PAD = 0


def sample(prompt, output, logprobs, advantage=0.0):
    return Sample(group_id=GroupId(0), prompt_ids=prompt, output_ids=output, behaviour_logprobs=logprobs,
                  token_versions=[0] * len(output), reward=0.0, advantage=advantage)


SAMPLES = [
    sample([1, 5, 6], [7, 8, 2], [-0.1, -0.2, -0.3], advantage=1.5),
    sample([1, 5], [9], [-0.4], advantage=-0.5),
    sample([1, 4, 4, 4], [3, 3], [-0.6, -0.7]),
]


def test_collate_right_pads_prompt_and_completion_and_each_padding_token_is_its_own_sequence():
    batch = collate(SAMPLES, PAD)
    assert batch.input_ids.tolist() == [[1, 5, 6, 7, 8, 2], [1, 5, 9, 0, 0, 0], [1, 4, 4, 4, 3, 3]]
    assert batch.position_ids.tolist() == [list(range(6)), [0, 1, 2, 0, 0, 0], list(range(6))]
    assert batch.advantages.tolist() == [1.5, -0.5, 0.0]
    assert batch.anchor_logp is None


def test_completion_layout_holds_each_sequence_completion_from_column_zero():
    batch = collate(SAMPLES, PAD)
    assert batch.completion_mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    assert batch.num_tokens == 6
    # The batch stores the Python floats in fp32: one rounding, 2**-24 relative at most, inside approx's rel=1e-6.
    for row, s in enumerate(SAMPLES):
        assert batch.behaviour_logprobs[row][batch.completion_mask[row]].tolist() == pytest.approx(
            s.behaviour_logprobs)
    assert (batch.behaviour_logprobs[~batch.completion_mask] == 0).all()


@pytest.mark.parametrize("packed", [False, True])
def test_score_positions_point_at_the_token_before_each_completion_token(packed):
    batch = collate(SAMPLES, PAD, packed=packed)
    flat = batch.input_ids.reshape(-1)
    # The logits at position p predict the token at p + 1, which is the completion token scored.
    assert flat[batch.score_positions + 1].tolist() == batch.score_targets.tolist()
    assert batch.score_targets.tolist() == [t for s in SAMPLES for t in s.output_ids]
    placed = batch.scored(batch.score_targets.float())
    for row, s in enumerate(SAMPLES):
        assert placed[row][batch.completion_mask[row]].tolist() == s.output_ids


def test_packed_rows_restart_positions_per_sequence():
    batch = collate(SAMPLES, PAD, packed=True)
    assert batch.input_ids.tolist() == [[1, 5, 6, 7, 8, 2, 1, 5, 9, 1, 4, 4, 4, 3, 3]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 2, 3, 4, 5]]


def test_an_empty_micro_batch_scores_one_masked_padding_entry():
    batch = collate([], PAD)
    assert batch.input_ids.tolist() == [[PAD]]
    assert batch.score_positions.tolist() == [0] and batch.num_tokens == 0
    assert batch.completion_mask.tolist() == [[False]]


def derived(prompts=4, n=4, **train):
    return derive(FasyncConfig.model_validate({"rollout": {"batch_size": prompts, "n_samples_per_prompt": n},
                                               "train": {"micro_batch_size": 1, **train}}))


def test_exact_fit_is_every_sample_in_whole_steps():
    steps, trimmed = plan_steps(16, derived(global_batch_size=8), dynamic_global_batch=False)
    assert steps == [range(8), range(8, 16)]
    assert trimmed == 0


def test_leftover_that_fills_no_step_is_trimmed():
    plan = derived(global_batch_size=6)
    assert plan.num_steps_per_rollout == 2 and plan.trimmed_samples_per_rollout == 4
    steps, trimmed = plan_steps(16, plan, dynamic_global_batch=False)
    assert steps == [range(6), range(6, 12)]
    assert trimmed == 4


def test_explicit_steps_per_rollout_below_what_fits_trims_the_rest():
    steps, trimmed = plan_steps(16, derived(global_batch_size=4, num_steps_per_rollout=3), dynamic_global_batch=False)
    assert steps == [range(4), range(4, 8), range(8, 12)]
    assert trimmed == 4


def test_explicit_steps_per_rollout_above_what_fits_takes_the_whole_steps_there_are():
    steps, trimmed = plan_steps(16, derived(global_batch_size=6, num_steps_per_rollout=4), dynamic_global_batch=False)
    assert steps == [range(6), range(6, 12)]
    assert trimmed == 4


@pytest.mark.parametrize("num_samples", [16, 11])
def test_dynamic_global_batch_is_one_step_of_everything(num_samples):
    plan = derived(global_batch_size=6, use_dynamic_global_batch_size=True)
    assert plan.effective_global_batch_size == 16
    steps, trimmed = plan_steps(num_samples, plan, dynamic_global_batch=True)
    assert steps == [range(num_samples)]
    assert trimmed == 0


def test_a_short_rollout_is_one_smaller_step():
    steps, trimmed = plan_steps(5, derived(global_batch_size=8), dynamic_global_batch=False)
    assert steps == [range(5)]
    assert trimmed == 0


def test_a_rollout_short_of_the_planned_steps_keeps_the_whole_ones():
    steps, trimmed = plan_steps(12, derived(global_batch_size=8), dynamic_global_batch=False)
    assert steps == [range(8)]
    assert trimmed == 4


def test_no_samples_no_steps():
    assert plan_steps(0, derived(global_batch_size=8), dynamic_global_batch=False) == ([], 0)
    assert plan_steps(0, derived(use_dynamic_global_batch_size=True), dynamic_global_batch=True) == ([], 0)


def test_ranks_take_interleaved_shares_cut_into_micro_batches():
    step = range(3, 13)
    equal = [5] * 13
    assert rank_micro_batches(step, equal, 0, 2, 2) == [[3, 5], [7, 9], [11]]
    assert rank_micro_batches(step, equal, 1, 2, 2) == [[4, 6], [8, 10], [12]]


def test_micro_batches_group_samples_of_similar_length():
    lengths = [9, 3, 8, 4, 2, 7]
    assert rank_micro_batches(range(6), lengths, 0, 1, 2) == [[4, 1], [3, 5], [2, 0]]
    # Dealt out after ordering: each rank gets short and long samples alike.
    assert rank_micro_batches(range(6), lengths, 0, 2, 2) == [[4, 3], [2]]
    assert rank_micro_batches(range(6), lengths, 1, 2, 2) == [[1, 5], [0]]


@pytest.mark.parametrize("world_size,micro", [(1, 4), (2, 3), (3, 2), (4, 8)])
def test_rank_shares_are_disjoint_and_cover_the_step(world_size, micro):
    step = range(8, 30)
    lengths = [(7 * i) % 11 for i in range(30)]
    shares = [[i for batch in rank_micro_batches(step, lengths, rank, world_size, micro) for i in batch]
              for rank in range(world_size)]
    flat = [i for share in shares for i in share]
    assert sorted(flat) == list(step)
    assert len(flat) == len(set(flat))
    for rank in range(world_size):
        assert all(len(batch) <= micro for batch in rank_micro_batches(step, lengths, rank, world_size, micro))


def test_token_budget_packs_first_fit_longest_first_and_a_long_sample_goes_alone():
    lengths = [9, 3, 8, 4, 2, 7, 20]
    batches = rank_micro_batches(range(7), lengths, 0, 1, 1, max_tokens=12)
    assert batches == [[6], [0, 1], [2, 3], [5, 4]]
    assert all(sum(lengths[i] for i in b) <= 12 for b in batches if len(b) > 1)


def test_ranks_with_fewer_micro_batches_get_empty_ones_to_stay_paired():
    lengths = [5] * 5
    assert rank_micro_batches(range(5), lengths, 0, 2, 2) == [[0, 2], [4]]
    assert rank_micro_batches(range(5), lengths, 1, 2, 2) == [[1, 3], []]
