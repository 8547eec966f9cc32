"""C: off-policy correction — importance weights, rejection masks and the PPO ratio's anchor
(fasync.train.correction, fasync.train.trainer; docs/correction.md).

How the trainer uses the behaviour logprobs, by effective `correction.ratio_anchor`:
- `behaviour`: the PPO ratio is π_θ / π_behav; importance weights are not applied again.
- `proximal`: the ratio is taken against the step's own detached forward (value 1); the weight
  π_prox / π_behav, applied only when `correction.level` is set, carries the correction.
- `recompute`: the ratio is taken against π_old recomputed at the start of the rollout; weights
  π_old / π_behav when `correction.level` is set.
Rejection masks apply with every anchor.
"""

from __future__ import annotations

from fasync.diagnostics import Severity
from fasync.lint.registry import Finding, rule
from fasync.lint.rules.facts import (
    BEHAVIOUR_LOGPROB_TRANSFORMS,
    TRAINER_LOGPROB_TRANSFORMS,
    active_transforms,
    uncorrected,
    uncorrected_partial_rollout,
    worst_lag,
)
from fasync.modes import ASYNC_MODES

_TRANSFORMS = {
    "temperature": ("rollout.temperature", "temperature scaling"),
    "top_p": ("rollout.top_p", "the top-p cut and renormalisation"),
    "top_k": ("rollout.top_k", "the top-k cut and renormalisation"),
}


def _behaviour_logprob_uses(cfg, derived) -> list[str]:
    """The parts of the loss that compare training logprobs with the engine's."""
    correction = cfg.correction
    uses = []
    if derived.ratio_anchor == "behaviour":
        uses.append("the PPO ratio (`correction.ratio_anchor` behaviour)")
    elif correction.level != "none":
        uses.append(f"the importance weights (`correction.level` {correction.level})")
    if any(v is not None for v in (correction.reject_token_ratio, correction.reject_sequence_ratio,
                                   correction.reject_kl)):
        uses.append("the rejection masks")
    return uses


@rule(
    "C001", "logprob-transform-mismatch", Severity.WARNING,
    summary="Behaviour and training logprobs score different sampling distributions.",
    what="Reports a sampling setting (`rollout.top_p` below 1, a `rollout.temperature` other than 0 and 1) "
    "that the rollout engine's behaviour logprobs include and the trainer's do not, or the reverse, while the "
    "behaviour logprobs enter the loss: importance weights (`correction.level`), a PPO ratio anchored at "
    "them (`correction.ratio_anchor: behaviour`) or a rejection mask. Both engines (`hf`, `vllm`) return "
    "logprobs after temperature and top-p; the trainer applies the temperature but not top-p.",
    why="The importance ratio π_train/π_behav is meant to measure how far the policies moved. When one side "
    "is the nucleus distribution (renormalised over the top-p tokens) and the other the full softmax, every "
    "sampled token's ratio is off by the nucleus mass even when the weights are identical: the weights are "
    "biased, the rejection masks reject fresh tokens, and the clipped ratio starts away from 1. This "
    "training/inference mismatch is a known source of trouble in verl, TRL and vLLM-based trainers.",
)
def logprob_transform_mismatch(cfg, derived):
    uses = _behaviour_logprob_uses(cfg, derived)
    if not uses:
        return
    engine = cfg.rollout.engine
    included = BEHAVIOUR_LOGPROB_TRANSFORMS[engine]
    for transform in sorted((included ^ TRAINER_LOGPROB_TRANSFORMS) & active_transforms(cfg)):
        key, description = _TRANSFORMS[transform]
        with_it, without_it = ((f"the {engine} engine's behaviour logprobs", "the trainer's") if transform in included
                               else ("the trainer's logprobs", f"the {engine} engine's"))
        value = getattr(cfg.rollout, transform)
        yield Finding(
            key,
            f"`{key}` {value:g}: {with_it} include {description} and {without_it} do not, so π_train/π_behav is "
            f"off even for samples of the current weights, and {' and '.join(uses)} inherit that bias",
            f"sample with the default `{key}` when behaviour logprobs enter the loss",
        )


def _interval_problem(low: float, high: float) -> str | None:
    """Why [low, high] cannot keep the ratio 1 of a token whose two policies agree, or None."""
    if low == high:
        return f"is the single point {low:g}, which almost no floating-point ratio equals"
    if low > 1 or high < 1:
        return "excludes 1.0, the ratio of a token whose training and behaviour policies agree"
    return None


@rule(
    "C002", "rejection-excludes-one", Severity.ERROR,
    summary="A rejection interval that rejects fresh tokens: nearly everything is masked.",
    what="Reports a `correction.reject_token_ratio` or `correction.reject_sequence_ratio` interval that does "
    "not contain 1.0, or is a single point.",
    why="The ratio of a token (or the geometric-mean ratio of a sequence) is 1 when the training and "
    "behaviour policies agree, and stays near 1 for fresh data. An interval without 1 masks exactly the "
    "tokens that most deserve training, keeps only the most off-policy ones, and masks everything when the "
    "data is fresh; the trainer skips each step in which every token is masked (`is/all_rejected`), so the "
    "run stops learning. (The weight bounds `weight_lower`/`weight_upper` truncate rather than reject: C005.)",
)
def rejection_excludes_one(cfg, derived):
    for name, unit in (("reject_token_ratio", "token"), ("reject_sequence_ratio", "sequence")):
        bounds = getattr(cfg.correction, name)
        problem = _interval_problem(*bounds) if bounds is not None else None
        if problem is not None:
            low, high = bounds
            yield Finding(
                f"correction.{name}",
                f"`correction.{name}` [{low:g}, {high:g}] {problem}: every {unit} of fresh data is masked, and a "
                "step whose tokens are all masked is skipped",
                f"use an interval around 1 for `correction.{name}`, e.g. [0.5, 2.0]",
            )


@rule(
    "C003", "level-ignored-by-behaviour-anchor", Severity.WARNING,
    summary="`correction.level` has no effect when the PPO ratio is anchored at the behaviour policy.",
    what="Reports `correction.ratio_anchor: behaviour` with a `correction.level` other than none.",
    why="With the behaviour anchor the PPO ratio π_θ/π_behav already is the importance ratio, so the trainer "
    "does not apply the weights a second time: only the rejection masks and the `is/` diagnostics use the "
    "correction settings. The config reads as if weights were applied; they are not, and `weight_upper`, "
    "`weight_lower` and `batch_normalize` do nothing.",
)
def level_ignored_by_behaviour_anchor(cfg, derived):
    level = cfg.correction.level
    if derived.ratio_anchor == "behaviour" and level != "none":
        yield Finding(
            "correction.level",
            f"`correction.level` {level} has no effect with `correction.ratio_anchor` behaviour: the PPO ratio "
            "π_θ/π_behav already is the importance ratio, so the trainer does not apply the weights again "
            "(only rejection masks and `is/` diagnostics)",
            "remove `correction.level` (none), or set `correction.ratio_anchor: proximal` to train with the weights",
        )


@rule(
    "C004", "uncorrected-staleness", Severity.WARNING,
    summary="Stale samples are trained on with no importance weight.",
    what="Reports `correction.level: none` without a rejection mask when the data can be off-policy (a worst "
    "policy lag above 0 optimizer steps, or unbounded) and the PPO ratio is anchored at a trainer-side "
    "policy: `proximal` (decoupled PPO), or `recompute` in async and fully_async. The async modes' default "
    "anchor is `behaviour` unless `correction.level` is set, so only a config that chooses one of these "
    "anchors is reported. fully_async partial rollouts are reported by S005 instead.",
    why="Decoupled PPO clips the ratio around the proximal policy and relies on the weight π_prox/π_behav "
    "for the off-policy correction; the trainer applies that weight only when `correction.level` is set. "
    "Without it (and likewise with a recomputed anchor in an async mode) nothing in the loss accounts for "
    "the samples having come from older weights: they are trained on as if the current policy had sampled "
    "them, and the staleness the bound allows goes uncorrected.",
)
def uncorrected_staleness(cfg, derived):
    anchor, lag = derived.ratio_anchor, derived.max_lag.steps
    trainer_side = anchor == "proximal" or (anchor == "recompute" and cfg.mode in ASYNC_MODES)
    if not uncorrected(cfg, derived) or lag == 0 or not trainer_side or uncorrected_partial_rollout(cfg, derived):
        return
    anchored, policy = {"proximal": ("the proximal policy (decoupled PPO)", "π_prox"),
                        "recompute": ("the policy recomputed at the start of each rollout", "π_old")}[anchor]
    age = "unbounded staleness" if lag is None else f"a worst policy lag of {worst_lag(cfg, derived)}"
    yield Finding(
        "correction.level",
        f"the PPO ratio is anchored at {anchored} but `correction.level` is none, so no {policy}/π_behav weight "
        f"applies: samples are trained on as if the current policy had sampled them, with {age}",
        "set `correction.level: token` (truncated at `correction.weight_upper`), or `correction.ratio_anchor: "
        "behaviour` to take the PPO ratio against the rollout logprobs",
    )


@rule(
    "C005", "truncation-excludes-one", Severity.WARNING,
    summary="Importance-weight truncation bounds that do not contain 1.",
    what="Reports, when importance weights are applied (`correction.level` set, anchor not `behaviour`), a "
    "`correction.weight_upper` below 1, a `correction.weight_lower` above 1, or equal bounds.",
    why="Truncation clamps each weight into [weight_lower, weight_upper]. A token whose policies agree has "
    "weight 1; bounds that exclude 1 move every fresh token's weight to the bound, and equal bounds make "
    "every weight the same constant. Either way the weights stop telling tokens apart: the result is a "
    "rescaled learning rate plus a bias, not an off-policy correction.",
)
def truncation_excludes_one(cfg, derived):
    correction = cfg.correction
    if correction.level == "none" or derived.ratio_anchor == "behaviour":
        return
    low = correction.weight_lower if correction.weight_lower is not None else 0.0
    problem = _interval_problem(low, correction.weight_upper)
    if problem is None:
        return
    key = "correction.weight_upper" if correction.weight_upper <= 1 else "correction.weight_lower"
    yield Finding(
        key,
        f"importance weights are truncated to [{low:g}, {correction.weight_upper:g}], which {problem}: every fresh "
        "token's weight is moved to a bound",
        "keep 1 inside the bounds: `correction.weight_upper` above 1 (default 2.0) and `correction.weight_lower` "
        "below 1 or null",
    )
