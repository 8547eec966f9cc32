"""A: the algorithm — advantages and the PPO loss (fasync.train.advantages, fasync.train.losses)."""

from __future__ import annotations

from fasync.diagnostics import Severity
from fasync.lint.registry import Finding, rule


@rule(
    "A001", "grpo-single-sample", Severity.ERROR,
    summary="Group-relative advantages with one sample per prompt: every advantage is zero.",
    what="Reports `train.advantage_estimator: grpo` with `rollout.n_samples_per_prompt: 1`.",
    why="GRPO's advantage is a sample's reward minus the mean reward of its prompt group. A group of one "
    "sample is its own mean, so every advantage is exactly 0 and the policy-gradient term of the loss is zero "
    "at every step: the run spends its compute and learns nothing (only the KL and entropy terms, if any, "
    "move the weights).",
)
def grpo_single_sample(cfg, derived):
    if cfg.train.advantage_estimator == "grpo" and cfg.rollout.n_samples_per_prompt == 1:
        yield Finding(
            "rollout.n_samples_per_prompt",
            "with 1 sample per prompt each grpo group's mean is its only reward, so every advantage is 0",
            "set `rollout.n_samples_per_prompt` to 2 or more (GRPO needs several completions of the same prompt "
            "to compare), or `train.advantage_estimator: reinforce_baseline` (baseline: the batch mean)",
        )


@rule(
    "A002", "greedy-grpo", Severity.ERROR,
    summary="Greedy decoding with group-relative advantages: all completions of a prompt are identical.",
    what="Reports `rollout.temperature: 0` (greedy decoding) with `train.advantage_estimator: grpo` and "
    "more than one sample per prompt.",
    why="Greedy decoding is deterministic: the n completions of a prompt are the same sequence, get the same "
    "reward, and their group-relative advantages are all 0. Nothing is learned, and with "
    "`rollout.dynamic_sampling` every group is dropped as well (G001). Policy-gradient methods need samples "
    "from the policy's own distribution.",
)
def greedy_grpo(cfg, derived):
    n = cfg.rollout.n_samples_per_prompt
    if cfg.rollout.temperature == 0 and cfg.train.advantage_estimator == "grpo" and n > 1:
        yield Finding(
            "rollout.temperature",
            f"`rollout.temperature` 0 decodes greedily: the {n} completions of each prompt are identical, so every "
            "grpo advantage is 0",
            "sample from the policy: set `rollout.temperature: 1.0` (the distribution the trainer scores)",
        )


@rule(
    "A003", "clip-low-disabled", Severity.WARNING,
    summary="`train.clip_eps_low` of 1 or more: the PPO ratio is never clipped from below.",
    what="Reports `train.clip_eps_low` ≥ 1, which puts the lower clip bound 1 − clip_eps_low at or below 0.",
    why="The ratio π_θ/π_old is always positive, so a lower bound at or below 0 never binds and tokens with "
    "a negative advantage can be pushed towards probability 0 without limit in one step. Clip-higher (DAPO) "
    "widens the upper bound, `train.clip_eps_high`, and keeps the lower one; a value of 1 or more here is "
    "usually that intent applied to the wrong side.",
)
def clip_low_disabled(cfg, derived):
    low = cfg.train.clip_eps_low
    if low >= 1:
        yield Finding(
            "train.clip_eps_low",
            f"`train.clip_eps_low` {low:g} puts the lower clip bound at 1 − {low:g} = {1 - low:g}: the ratio is "
            "always positive, so it is never clipped from below",
            "set `train.clip_eps_low` below 1 (default 0.2); to let unlikely tokens grow faster, raise "
            "`train.clip_eps_high` instead",
        )
