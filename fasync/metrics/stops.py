"""When a run stops before its last rollout: its recent rewards reached `train.target_reward`, or a stop was
requested (Ctrl-C, SIGTERM). Either way the driver stops at the end of the rollout (drain) in progress."""

from __future__ import annotations

from collections.abc import Sequence

from fasync.metrics.steps import REWARD_WINDOW


class StopCriteria:
    def __init__(self, target_reward: float | None):
        self.target_reward = target_reward
        self.reason: str | None = None
        """Why the driver stopped early (the target reward, a requested stop); None when it ran all its rollouts."""
        self.requested: str | None = None
        """The outcome a stop was asked for with (`request`); the drivers stop at the next rollout's end."""

    def request(self, outcome: str, reason: str) -> None:
        """Stop at the end of the rollout (drain) in progress, with a checkpoint."""
        self.requested = outcome
        self.reason = reason

    def met(self, recent_rewards: Sequence[float]) -> bool:
        """After each rollout (drain): the target reached over the last `REWARD_WINDOW` rollouts, or a stop
        requested."""
        return self.requested is not None or self.reached_target(recent_rewards)

    def reached_target(self, recent_rewards: Sequence[float]) -> bool:
        target = self.target_reward
        if target is None or len(recent_rewards) < REWARD_WINDOW:
            return False
        if sum(recent_rewards) / len(recent_rewards) >= target:
            self.reason = f"reached target reward {target}"
            return True
        return False
