"""P: the run plan — when it stops (`train.target_reward`) and what it saves (`checkpoint.*`)."""

from __future__ import annotations

from fasync.diagnostics import Severity
from fasync.lint.registry import Finding, rule
from fasync.lint.rules.facts import REWARD_RANGES


def _target_and_range(cfg):
    """The target reward and the built-in reward's (lowest, highest), or None when either is unknown."""
    target, reward = cfg.train.target_reward, cfg.reward.function
    if target is None or reward not in REWARD_RANGES or cfg.reward.url is not None:
        return None
    return target, REWARD_RANGES[reward]


@rule(
    "P001", "unreachable-target-reward", Severity.ERROR,
    summary="`train.target_reward` is above the most the reward can give.",
    what="Reports a `train.target_reward` above the highest value of the built-in reward in "
    "`reward.function` (1.0 for every built-in reward). Custom rewards (`module:function`) and remote ones "
    "(`reward.url`) are not checked.",
    why="Early stopping compares the running mean reward with the target; a target above the reward's "
    "maximum is never met, so the run always runs all `train.num_rollouts`, which is usually not what a "
    "target was set for (often a reward scale from another framework or a percentage).",
)
def unreachable_target_reward(cfg, derived):
    known = _target_and_range(cfg)
    if known is not None and known[0] > known[1][1]:
        target, (_, highest) = known
        yield Finding(
            "train.target_reward",
            f"`train.target_reward` {target:g} is above the highest `{cfg.reward.function}` reward ({highest:g}): "
            "the target is never reached",
            f"set `train.target_reward` to at most {highest:g}, or null to run all `train.num_rollouts`",
        )


@rule(
    "P002", "trivial-target-reward", Severity.WARNING,
    summary="`train.target_reward` is at or below the least the reward can give: the run stops at once.",
    what="Reports a `train.target_reward` at or below the lowest value of the built-in reward in "
    "`reward.function` (0.0 for every built-in reward).",
    why="Any running mean reaches such a target, so the run stops as soon as its first running mean is "
    "taken, after a few rollouts, having learned nothing.",
)
def trivial_target_reward(cfg, derived):
    known = _target_and_range(cfg)
    if known is not None and known[0] <= known[1][0]:
        target, (lowest, _) = known
        yield Finding(
            "train.target_reward",
            f"`train.target_reward` {target:g} is at or below the lowest `{cfg.reward.function}` reward "
            f"({lowest:g}): the run stops after its first few rollouts",
            "set `train.target_reward` to the reward you want to reach, or null to run all `train.num_rollouts`",
        )


@rule(
    "P003", "checkpoint-never-saved", Severity.WARNING,
    summary="No checkpoint is taken before the run ends.",
    what="Reports `checkpoint.every` (optimizer steps) above the run's optimizer steps, "
    "`train.num_rollouts` × `train.ppo_epochs` × `num_steps_per_rollout`.",
    why="A checkpoint is written once another `checkpoint.every` optimizer steps were taken, and at a stop; a "
    "period longer than the run is never reached, so a run killed (preempted, out of memory) before its end "
    "cannot be resumed and loses everything. Setting `every` at all says a checkpoint was wanted.",
)
def checkpoint_never_saved(cfg, derived):
    every, steps = cfg.checkpoint.every, derived.total_optimizer_steps
    if every > steps:
        yield Finding(
            "checkpoint.every",
            f"`checkpoint.every` {every} exceeds the run's {steps} optimizer steps: no checkpoint is taken before "
            "the end, and a run killed midway cannot be resumed",
            f"set `checkpoint.every` to at most {steps}",
        )
