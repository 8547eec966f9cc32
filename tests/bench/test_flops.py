"""The medium shape's FLOP count (fasync.bench.flops), rewards and learnable task, on cases worked out by hand."""

from __future__ import annotations

import pytest

from fasync.bench import medium
from fasync.bench.flops import LlamaShape
from fasync.bench.rewards import word_lcs, word_match

CONFIG = {"hidden_size": 4, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
          "intermediate_size": 6, "vocab_size": 10}
"""Heads 2 wide; one key-value head, so that k and v are narrower than q and o."""


def test_the_parameters_are_the_linear_layers_weights():
    shape = LlamaShape.of(CONFIG)
    # Per layer: q and o 4 × 4 each, k and v 4 × 2 each, gate, up and down 4 × 6 each: 16 + 16 + 8 + 8 + 72 = 120.
    assert shape.body_parameters == 2 * 120
    assert shape.head_parameters == 4 * 10


def test_a_sequence_counts_every_token_through_the_body_the_completion_through_the_head_and_causal_attention():
    shape = LlamaShape.of(CONFIG)
    # 3 prompt and 2 completion tokens: body 2 × 240 × 5 = 2400; head 2 × 40 × 2 = 160; attention, per layer,
    # 4 × (2 heads × 2 wide) × (1 + 2 + 3 + 4 + 5 keys) = 240, over 2 layers 480.
    assert shape.forward_flops(3, 2) == 2400 + 160 + 480
    assert shape.generate_flops(3, 2) == 3040
    assert shape.train_flops(3, 2) == 3 * 3040


def test_a_configured_head_width_replaces_hidden_over_heads():
    shape = LlamaShape.of({**CONFIG, "head_dim": 3})
    # q and o 4 × 6 each, k and v 4 × 3 each, the MLP 72: 24 + 24 + 12 + 12 + 72 = 144 per layer.
    assert shape.body_parameters == 2 * 144


@pytest.mark.parametrize(("completion", "label", "reward"), [
    ("a b c", "a b c", 1.0),
    (" a  x c\n", "a b c", 2 / 3),  # whitespace only separates
    ("a b", "a b c", 2 / 3),  # a missing word counts as wrong
    ("a b c d", "a b", 0.5),  # so does an extra one
    ("b c", "a b c", 0.0),  # positions, not words found
    ("", "", 1.0),
])
def test_word_match_is_the_fraction_of_word_positions_right_over_the_longer(completion, label, reward):
    assert word_match(completion, label) == pytest.approx(reward, abs=1e-12)  # exact fractions of small counts


@pytest.mark.parametrize(("completion", "label", "reward"), [
    ("a b c d", "a b c d", 1.0),
    ("a c d", "a b c d", 3 / 4),  # a skipped word costs one, where word_match would give 1/4
    ("a b b c d", "a b c d", 4 / 5),  # so does a repeated one, over the longer
    ("d c b a", "a b c d", 1 / 4),  # order counts
    ("x y", "a b c d", 0.0),
    ("", "", 1.0),
])
def test_word_lcs_is_the_longest_common_subsequence_of_words_over_the_longer(completion, label, reward):
    assert word_lcs(completion, label) == pytest.approx(reward, abs=1e-12)  # exact fractions of small counts


def test_the_learnable_task_continues_one_cycle_and_its_other_answer_comes_from_the_other():
    words = medium.vocabulary()
    rows = medium.continuations(words, 50)
    assert rows == medium.continuations(words, 50)
    successor: dict[str, str] = {}
    rewarded, other = set(), set()
    for row in rows:
        prompt = row["prompt"].removeprefix("continue: ").split()
        label, second = row["label"].split(), row["other"].split()
        assert len(prompt) == len(label) == len(second) == medium.WORDS_PER_PROMPT
        run = prompt + label
        for before, after in zip(run, run[1:]):  # one cycle: every word has one successor in every row
            assert successor.setdefault(before, after) == after
        rewarded.update(run)
        other.update(second)
    assert len(rewarded) == len(other) == medium.WORDS // 2  # a cycle of 128 words each, split from the 256
    assert rewarded.isdisjoint(other) and rewarded | other == set(words)
    assert [medium.CONTINUE.reward(row["label"], row["label"]) for row in rows[:3]] == [1.0] * 3
    assert max(medium.CONTINUE.reward(row["other"], row["label"]) for row in rows) == 0.0
