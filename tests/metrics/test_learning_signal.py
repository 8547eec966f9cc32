"""The run-time warning for a run that has stopped learning (fasync/metrics/signal.py, issue 19 §4)."""

from fasync.metrics.registry import check_row
from fasync.metrics.signal import STREAK_STEPS, LearningSignal


def row(step: int, advantage: float = 0.4, entropy: float = 1.2, **extra) -> dict:
    return {"step": step, "advantage_abs_mean": advantage, "entropy": entropy, **extra}


def test_a_streak_of_zero_advantages_warns_once_at_k_steps():
    signal = LearningSignal()
    raised = [signal.observe(row(step, advantage=0.0)) for step in range(STREAK_STEPS + 3)]
    assert [len(r) for r in raised] == [0] * (STREAK_STEPS - 1) + [1, 0, 0, 0]
    assert raised[STREAK_STEPS - 1][0].startswith(f"every advantage was 0 for {STREAK_STEPS} optimizer steps in a "
                                                  f"row (up to step {STREAK_STEPS - 1})")
    assert signal.warnings == raised[STREAK_STEPS - 1]


def test_a_step_that_learns_ends_the_streak_and_a_skipped_one_does_not_count():
    signal = LearningSignal()
    rows = [row(0, entropy=0.0), row(1, entropy=0.0), row(2), row(3, entropy=1e-4),
            row(4, entropy=0.0, skipped=True), row(5, entropy=0.0)]
    assert [signal.observe(r) for r in rows] == [[]] * 6
    assert [r["entropy_collapse_streak"] for r in rows] == [1, 2, 0, 1, 1, 2]
    assert [r["zero_advantage_streak"] for r in rows] == [0] * 6


def test_entropy_collapse_and_zero_advantages_are_separate_warnings():
    signal = LearningSignal()
    for step in range(STREAK_STEPS):
        signal.observe(row(step, advantage=0.0, entropy=0.0))
    assert len(signal.warnings) == 2 and "entropy stayed at or below 0.001 nats/token" in signal.warnings[1]
    assert "A005" in signal.warnings[1]


def test_the_streaks_are_registered_metrics_in_every_mode():
    observed = row(0)
    LearningSignal().observe(observed)
    assert {"zero_advantage_streak", "entropy_collapse_streak"} <= set(observed)
    for mode in ("sync", "async", "fully_async"):
        check_row(observed, mode)
