"""The medium shape's FLOP count (fasync.bench.flops) and reward, on cases worked out by hand."""

from __future__ import annotations

import pytest

from fasync.bench.flops import LlamaShape
from fasync.bench.rewards import word_match

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
