"""Run-time warnings for a run that has stopped learning, from the step rows as they are written.

A config can look sound and still train nothing: a learning rate that collapses the policy's entropy in a
step, or sampling so narrow that every group's rewards agree. The rows show it: every advantage 0
(`advantage_abs_mean` 0) or entropy near 0, step after step. After `STREAK_STEPS` such optimizer steps in a
row, the run warns once per cause, on the console and in summary.json; each row records how long each streak
is (`zero_advantage_streak`, `entropy_collapse_streak` in fasync/metrics/registry.py).
"""

from __future__ import annotations

STREAK_STEPS = 5
"""Consecutive optimizer steps after which a streak is reported (K)."""
ENTROPY_FLOOR = 1e-3
"""Entropy (nats/token) at or below which the policy counts as collapsed: at most about one token in a thousand
positions is not the one it always picks."""

CAUSES = {
    "zero_advantage_streak": (
        lambda row: row["advantage_abs_mean"] == 0,
        "every advantage was 0 for {streak} optimizer steps in a row (up to step {step}): every sample's reward "
        "equalled its group's (grpo) or batch's (reinforce_baseline) mean, so these steps learned nothing. Look at "
        "`rollout.temperature`, the reward, and whether the task is already solved (`train.target_reward`)",
    ),
    "entropy_collapse_streak": (
        lambda row: row["entropy"] <= ENTROPY_FLOOR,
        "the policy's entropy stayed at or below {floor:g} nats/token for {streak} optimizer steps in a row (up to step {step}): it always picks the same tokens, so groups stop differing and "
        "learning stops. A `train.lr` too high for the model (lint rule A005) does this within a step",
    ),
}


class LearningSignal:
    """Counts each cause's streak over the rows it is shown; a skipped step neither extends nor ends one."""

    def __init__(self) -> None:
        self.streaks = dict.fromkeys(CAUSES, 0)
        self.warned: set[str] = set()
        self.warnings: list[str] = []
        """One message per cause that reached `STREAK_STEPS`, in the order they did."""

    def observe(self, row: dict) -> list[str]:
        """Add the streak lengths to `row`; returns the warnings this row raised (each cause warns once)."""
        raised = []
        for name, (holds, text) in CAUSES.items():
            if row.get("skipped") or row.get("advantage_abs_mean") is None or row.get("entropy") is None:
                row[name] = self.streaks[name]
                continue
            self.streaks[name] = self.streaks[name] + 1 if holds(row) else 0
            row[name] = self.streaks[name]
            if self.streaks[name] >= STREAK_STEPS and name not in self.warned:
                self.warned.add(name)
                raised.append(text.format(streak=STREAK_STEPS, step=row["step"], floor=ENTROPY_FLOOR))
        self.warnings += raised
        return raised
