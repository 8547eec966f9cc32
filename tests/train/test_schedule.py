"""The learning-rate schedule against hand-computed factors (fasync/train/schedule.py; plain floats, so exact up to
float64 rounding: rel=1e-12)."""

import math

import pytest

from fasync.train.schedule import lr_factor


def test_warmup_rises_linearly_to_the_peak_at_the_first_step_after_it():
    assert [lr_factor(step, 3, 10, "constant") for step in range(5)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0],
                                                                                      rel=1e-12)


@pytest.mark.parametrize("schedule, expected", [
    ("constant", [1.0, 1.0, 1.0, 1.0]),
    ("linear", [1.0, 0.75, 0.5, 0.25]),
    ("cosine", [1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 - math.cos(math.pi / 4))]),
])
def test_decay_after_warmup_ends_above_zero_at_the_last_step(schedule, expected):
    # 7 steps, 3 of warmup: steps 3..6 decay over 4 steps.
    assert [lr_factor(step, 3, 7, schedule) for step in range(3, 7)] == pytest.approx(expected, rel=1e-12)


def test_no_warmup_starts_at_the_peak_and_steps_past_the_end_stay_at_zero():
    assert lr_factor(0, 0, 4, "linear") == 1.0
    assert lr_factor(9, 0, 4, "linear") == 0.0
    assert lr_factor(9, 0, 4, "cosine") == pytest.approx(0.0, abs=1e-15)
