"""A: the algorithm — advantages and the PPO loss (fasync.train.advantages, fasync.train.losses)."""

from __future__ import annotations

import math

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
    low = derived.clip_eps[0]
    if low >= 1:
        yield Finding(
            "train.clip_eps_low",
            f"`train.clip_eps_low` {low:g} puts the lower clip bound at 1 − {low:g} = {1 - low:g}: the ratio is "
            "always positive, so it is never clipped from below",
            "set `train.clip_eps_low` below 1 (default 0.2); to let unlikely tokens grow faster, raise "
            "`train.clip_eps_high` instead",
        )


NEAR_TIE_NATS = 0.1
"""Logit gap of a near tie: two tokens the policy samples 52.5% and 47.5% of the time at temperature 1."""
DEVIATION_CHANCE = 0.01
"""A004 and A006 fire when even a generous bound on the chance that sampling leaves the greedy path falls
below this."""


def runner_up_probability(temperature: float, gap: float = NEAR_TIE_NATS) -> float:
    """The chance that sampling at `temperature` picks a token `gap` nats of logit below the only other one:
    1 / (1 + e^(gap / temperature)); 0 for greedy decoding."""
    if temperature == 0:
        return 0.0
    odds = math.exp(-gap / temperature)  # underflows to 0 for a tiny temperature, which is the answer
    return odds / (1 + odds)


def greedy_in_effect(temperature: float, positions: int) -> tuple[float, float] | None:
    """When `positions` sampled tokens almost surely all follow the most likely token, even if every one of
    them were a near tie (positions × p(temperature) below `DEVIATION_CHANCE`): p(temperature) and the lowest
    temperature that escapes the bound. None when sampling can leave the greedy path."""
    chance = runner_up_probability(temperature)
    if positions * chance >= DEVIATION_CHANCE:
        return None
    wanted = DEVIATION_CHANCE / positions  # solve positions × p(τ) = DEVIATION_CHANCE for τ
    return chance, NEAR_TIE_NATS / math.log((1 - wanted) / wanted)


def _probability(chance: float) -> str:
    return f"{chance:.2g}" if chance > 0 else "below 1e-300"


@rule(
    "A004", "near-greedy-grpo", Severity.ERROR,
    summary="A temperature so low that the completions of a prompt are almost surely identical.",
    what="Reports `rollout.temperature` above 0 (greedy decoding is A002) with `train.advantage_estimator: grpo` "
    "and more than one sample per prompt, when even at every token a near tie (two tokens 0.1 nat of logit "
    "apart, 52.5% / 47.5% at temperature 1) the expected number of tokens where a group's completions differ, "
    "(n − 1) × `rollout.max_new_tokens` × 1 / (1 + e^(0.1 / temperature)), is below 0.01.",
    why="Dividing the logits by a tiny temperature makes sampling greedy in all but name: a token is chosen "
    "over the most likely one with probability about e^(−gap / temperature), which vanishes for any gap. The "
    "n completions of a prompt are then the same sequence with the same reward, every group-relative "
    "advantage is 0, and the run learns nothing while appearing to sample (A002 reports temperature 0 "
    "itself).",
)
def near_greedy_grpo(cfg, derived):
    rollout = cfg.rollout
    n, temperature = rollout.n_samples_per_prompt, rollout.temperature
    if temperature == 0 or cfg.train.advantage_estimator != "grpo" or n < 2:
        return
    positions = (n - 1) * rollout.max_new_tokens
    greedy = greedy_in_effect(temperature, positions)
    if greedy is None:
        return
    chance, lowest = greedy
    yield Finding(
        "rollout.temperature",
        f"at `rollout.temperature` {temperature:g} even a near tie (two tokens 0.1 nat apart) picks the second token "
        f"with probability {_probability(chance)}, so over {n - 1} more completions of {rollout.max_new_tokens} "
        f"tokens a group expects at most {positions * chance:.2g} differing tokens: its {n} completions are almost "
        "surely identical and every grpo advantage is 0",
        f"sample from the policy: set `rollout.temperature: 1.0` (the distribution the trainer scores); below "
        f"{lowest:.2g} this group size and completion budget leave groups almost surely identical",
    )


@rule(
    "A006", "greedy-reinforce-baseline", Severity.WARNING,
    summary="`reinforce_baseline` with greedy or near-greedy sampling: no sample explores.",
    what="Reports `train.advantage_estimator: reinforce_baseline` with `rollout.temperature` 0, or so low that "
    "even at every token a near tie (0.1 nat of logit apart) the expected number of sampled tokens off the "
    "greedy path, n × `rollout.max_new_tokens` × 1 / (1 + e^(0.1 / temperature)), is below 0.01.",
    why="The batch-mean baseline compares different prompts, so the advantages are not all 0 by construction "
    "(as they are for grpo, A002/A004). But every completion is the policy's most likely one: the n samples of "
    "a prompt are copies, and no sample ever tries another answer, so a prompt answered wrongly stays wrong. "
    "When every greedy answer scores the same (all wrong, as for a fresh model) every advantage is 0 and the "
    "run learns nothing.",
)
def greedy_reinforce_baseline(cfg, derived):
    rollout = cfg.rollout
    if cfg.train.advantage_estimator != "reinforce_baseline":
        return
    positions = rollout.n_samples_per_prompt * rollout.max_new_tokens
    greedy = greedy_in_effect(rollout.temperature, positions)
    if greedy is None:
        return
    chance, lowest = greedy
    how = ("decodes greedily" if rollout.temperature == 0 else
           f"picks a near tie's second token with probability {_probability(chance)}, so its "
           f"{positions} sampled tokens per prompt almost surely all follow the greedy path")
    yield Finding(
        "rollout.temperature",
        f"`rollout.temperature` {rollout.temperature:g} {how}: every completion is the policy's most likely one, "
        "no sample explores another answer, and when all of them score the same every reinforce_baseline "
        "advantage is 0",
        f"sample from the policy: set `rollout.temperature: 1.0` (at least {lowest:.2g} for this sampling budget)",
    )


GPT3_PEAK_LEARNING_RATES = (
    (125e6, 6.0e-4), (350e6, 3.0e-4), (760e6, 2.5e-4), (1.3e9, 2.0e-4),
    (2.7e9, 1.6e-4), (6.7e9, 1.2e-4), (13e9, 1.0e-4), (175e9, 0.6e-4),
)
"""(parameters, peak Adam learning rate) of the GPT-3 models: Brown et al. 2020, "Language Models are Few-Shot
Learners", Table 2.1. The best learning rate falls with model size; these are pre-training peaks, which RL
fine-tuning stays well below."""
LEARNING_RATE_MARGIN = (1e-4, 10.0)
"""A005's range: from 1/10,000 of the peak for the model's size to 10 times it."""


def peak_learning_rate(parameters: float) -> float:
    """GPT-3's peak learning rate for a model of `parameters`: interpolated log-log between the table's sizes,
    and extended beyond them along the line through its first and last entries (the rate × 10 per ~3,000× fewer
    parameters that the table shows end to end)."""
    table = GPT3_PEAK_LEARNING_RATES
    (p_first, lr_first), (p_last, lr_last) = table[0], table[-1]
    slope = math.log(lr_last / lr_first) / math.log(p_last / p_first)
    if parameters <= p_first:
        return lr_first * (parameters / p_first) ** slope
    if parameters >= p_last:
        return lr_last * (parameters / p_last) ** slope
    for (p0, lr0), (p1, lr1) in zip(table, table[1:]):
        if parameters <= p1:
            return lr0 * (lr1 / lr0) ** (math.log(parameters / p0) / math.log(p1 / p0))
    raise AssertionError("unreachable: parameters lies within the table")


def _count(parameters: int) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if parameters >= size:
            return f"{parameters / size:.3g}{unit}"
    return str(parameters)


@rule(
    "A005", "learning-rate-out-of-range", Severity.ERROR,
    summary="A learning rate far outside what the model's size supports.",
    what="Reports `train.lr` above 10 times, or below 1/10,000 of, the peak learning rate GPT-3 was trained with "
    "at the model's size (Brown et al. 2020, Table 2.1: 6e-4 at 125M parameters down to 6e-5 at 175B; "
    "interpolated log-log, and extended along the same trend to smaller and larger models). The parameters "
    "are counted from `model.path`'s config.json or the embedded model's keys (fasync/memory.py).",
    why="The largest stable learning rate falls as models grow, and RL fine-tuning runs well below the "
    "pre-training peak. Far above it, the first updates destroy the policy: entropy collapses to 0 within a step, "
    "every completion of a prompt becomes the same and every advantage 0, and the run goes on to its end "
    "learning nothing. Far below it, the weights barely move in the whole run.",
)
def learning_rate_out_of_range(cfg, derived):
    from fasync.memory import model_dims

    dims = model_dims(cfg)
    if dims is None:
        return
    peak = peak_learning_rate(dims.parameters)
    low, high = (peak * factor for factor in LEARNING_RATE_MARGIN)
    lr = cfg.train.lr
    if low <= lr <= high:
        return
    side = f"above 10 × {peak:.2g}" if lr > high else f"below {peak:.2g} / 10,000"
    yield Finding(
        "train.lr",
        f"`train.lr` {lr:g} is {side}, where {peak:.2g} is the peak learning rate for {_count(dims.parameters)} "
        f"parameters ({dims.source}) on the trend of GPT-3's (Brown et al. 2020, Table 2.1): the range for this model "
        f"is {low:.2g} to {high:.2g}",
        f"set `train.lr` between {low:.2g} and {high:.2g} (RL fine-tuning of a pretrained model usually runs at "
        f"1/10 to 1/100 of {peak:.2g}), or add A005 to `lint.ignore` if the rate is deliberate",
    )


GROUP_BASELINES = ("rloo", "reinforce_plus_plus_baseline")
"""The estimators whose baseline is a group's other samples (rloo) or its mean (the REINFORCE++ baseline), and
which leave a lone sample its raw reward (grpo, whose every advantage is then 0, is A001)."""


@rule(
    "A007", "group-baseline-single-sample", Severity.WARNING,
    summary="A group baseline (rloo, reinforce_plus_plus_baseline) with one sample per prompt: no baseline at all.",
    what="Reports `train.advantage_estimator` rloo or reinforce_plus_plus_baseline with "
    "`rollout.n_samples_per_prompt: 1`.",
    why="RLOO compares a sample with the mean of the other samples of its prompt, and the REINFORCE++ baseline "
    "subtracts its prompt group's mean. A prompt with one sample has no others: its baseline is undefined, and "
    "both estimators (as verl computes them) then keep the raw reward. The run is plain REINFORCE without a "
    "baseline: every advantage of a 0/1 reward is 0 or positive, the gradient's variance is as high as it "
    "gets, and the estimator named in the config is not the one running.",
)
def group_baseline_single_sample(cfg, derived):
    estimator = cfg.train.advantage_estimator
    if estimator in GROUP_BASELINES and cfg.rollout.n_samples_per_prompt == 1:
        yield Finding(
            "rollout.n_samples_per_prompt",
            f"with 1 sample per prompt each {estimator} group has no other samples to form its baseline, so every "
            "sample keeps its raw reward as its advantage: REINFORCE without a baseline",
            "set `rollout.n_samples_per_prompt` to 2 or more (4 to 16 is usual), or "
            "`train.advantage_estimator: reinforce_plus_plus` (its baseline is the whole batch)",
        )


SEQUENCE_CLIP_LIMIT = 0.01
"""A008's threshold on a sequence ratio's clip: 25 times GSPO's 4e-4, and 1/20 of PPO's token-level 0.2."""


@rule(
    "A008", "gspo-token-clip-range", Severity.WARNING,
    summary="A sequence-level ratio (GSPO) clipped at a token-level range: the clip never binds.",
    what=f"Reports `train.importance_ratio: sequence` with `train.clip_eps_low` or `train.clip_eps_high` set "
    f"above {SEQUENCE_CLIP_LIMIT:g}.",
    why="GSPO's ratio is the geometric mean of a sequence's token ratios, exp(mean log(π/π_old)): averaging "
    "over hundreds of tokens keeps it within a fraction of a percent of 1 even when single tokens move by "
    "tens of percent. A clip range of 0.2, right for token ratios, then never binds, and the update is not "
    "trust-region limited at all. GSPO (Zheng et al. 2025) clips at 3e-4 below and 4e-4 above, fasync's "
    "defaults for a sequence ratio.",
)
def gspo_token_clip_range(cfg, derived):
    train = cfg.train
    if train.importance_ratio != "sequence":
        return
    for key in ("clip_eps_low", "clip_eps_high"):
        value = getattr(train, key)
        if value is not None and value > SEQUENCE_CLIP_LIMIT:
            yield Finding(
                f"train.{key}",
                f"`train.{key}` {value:g} is a token-level clip range, but `train.importance_ratio: sequence` clips "
                "the geometric mean of a sequence's token ratios, which stays far closer to 1: the clip never "
                "binds",
                f"remove `train.{key}` to take GSPO's default (3e-4 below, 4e-4 above), or set it at most "
                f"{SEQUENCE_CLIP_LIMIT:g}",
            )


STD_NORMALISED = ("grpo", "reinforce_baseline")
"""The estimators `train.normalize_advantage_std` applies to."""


@rule(
    "A009", "dr-grpo-with-std-normalisation", Severity.WARNING,
    summary="Dr. GRPO's loss aggregation with advantages still divided by the group std.",
    what="Reports `train.loss_aggregation: seq_mean_token_sum_norm` (Dr. GRPO) with "
    "`train.normalize_advantage_std: true` and an estimator it applies to (grpo, reinforce_baseline).",
    why="Dr. GRPO (Liu et al. 2025, \"Understanding R1-Zero-Like Training\") removes two biases of GRPO: the "
    "per-sequence length normalisation, which the constant divisor of seq_mean_token_sum_norm replaces, and the "
    "division by the group's std, which weights prompts whose rewards barely differ (nearly all right or all "
    "wrong) far above the rest. Keeping the std half-applies the method: the run is neither GRPO nor Dr. GRPO, "
    "and results compare with neither.",
)
def dr_grpo_with_std_normalisation(cfg, derived):
    train = cfg.train
    if (train.loss_aggregation == "seq_mean_token_sum_norm" and train.normalize_advantage_std
            and train.advantage_estimator in STD_NORMALISED):
        yield Finding(
            "train.normalize_advantage_std",
            "`train.loss_aggregation: seq_mean_token_sum_norm` is Dr. GRPO's, which also drops the division by "
            f"the group std; `train.normalize_advantage_std` true still divides the {train.advantage_estimator} "
            "advantages by it",
            "set `train.normalize_advantage_std: false` (Dr. GRPO), or `train.loss_aggregation: token_mean` to "
            "keep GRPO's std",
        )


@rule(
    "A010", "warmup-longer-than-run", Severity.WARNING,
    summary="A learning-rate warmup that lasts the whole run: the peak rate is never reached.",
    what="Reports `train.lr_warmup_steps` at or above the run's optimizer steps, `train.num_rollouts` × "
    "`train.ppo_epochs` × num_steps_per_rollout.",
    why="Warmup raises the learning rate linearly from `train.lr` / (warmup + 1) to `train.lr`. A warmup as "
    "long as the run ends before the peak: every step runs at a fraction of the rate the config names (half of "
    "it on average), and a decay schedule never starts. Usually the warmup was counted in other units "
    "(samples, or another framework's training steps) or the run was shortened without it.",
)
def warmup_longer_than_run(cfg, derived):
    warmup, total = cfg.train.lr_warmup_steps, derived.total_optimizer_steps
    if warmup and warmup >= total:
        yield Finding(
            "train.lr_warmup_steps",
            f"`train.lr_warmup_steps` {warmup} is not shorter than the run's {total} optimizer steps: the learning "
            f"rate never reaches `train.lr` {cfg.train.lr:g} (the last step runs at {total / (warmup + 1):.2g} of it)",
            f"set `train.lr_warmup_steps` well below {total} (a few percent of the run is usual)",
        )
