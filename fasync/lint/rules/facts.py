"""What the rules need to know about the rest of fasync, computed without torch, ray or vllm.

Each table states a fact about code elsewhere (named next to it); tests/lint/test_rules.py checks
that the tables cover every engine, reward and mode the schema allows.
"""

from __future__ import annotations

from fasync.config.derived import Derived
from fasync.config.schema import FasyncConfig

BEHAVIOUR_LOGPROB_TRANSFORMS: dict[str, frozenset[str]] = {
    # fasync.rollout.hf_engine: sampling_logprobs(logits, temperature, top_p, top_k).
    "hf": frozenset({"temperature", "top_p", "top_k"}),
    # fasync.rollout.vllm_engine: logprobs_mode="processed_logprobs", i.e. after temperature, top-k and top-p.
    "vllm": frozenset({"temperature", "top_p", "top_k"}),
}
"""Which sampling transforms each engine's behaviour logprobs include."""

TRAINER_LOGPROB_TRANSFORMS = frozenset({"temperature"})
"""What the trainer's logprobs include: fasync.train.trainer scores tokens with
fasync.model.token_logprobs(..., temperature), which has no top-p."""

REWARD_RANGES: dict[str, tuple[float, float]] = {
    "exact_match": (0.0, 1.0),
    "partial_match": (0.0, 1.0),
    "boxed_math": (0.0, 1.0),
    "math_verify": (0.0, 1.0),
}
"""Lowest and highest value of each built-in reward (fasync.data.rewards.BUILTIN_REWARDS)."""


def active_transforms(cfg: FasyncConfig) -> set[str]:
    """The sampling transforms that change the distribution: temperature 0 (greedy) is scored
    untempered by engines and trainer alike, so only a temperature other than 0 and 1 counts."""
    rollout = cfg.rollout
    active = set()
    if rollout.temperature not in (0.0, 1.0):
        active.add("temperature")
    if rollout.top_p < 1.0:
        active.add("top_p")
    if rollout.top_k is not None:
        active.add("top_k")
    return active


def unit(mode: str) -> str:
    """What one trainer iteration consumes: a rollout, or in fully_async a drain of the queue."""
    return "drain" if mode == "fully_async" else "rollout"


def worst_lag(cfg: FasyncConfig, derived: Derived) -> str:
    """`Derived.max_lag` (fasync/staleness.py computes it) with its arithmetic where a version spans several
    steps: "11 optimizer steps (2.75 versions), (staleness 2 + 1) × interval 1 × 4 steps per drain − 1", with
    "× 2 epochs" before the "− 1" under `train.ppo_epochs` 2."""
    lag, steps = derived.max_lag, derived.num_steps_per_rollout
    if lag.steps is None or lag.steps_per_version == 1:
        return lag.steps_and_versions()
    per = f"{plural(steps, 'step')} per {unit(cfg.mode)}"
    if cfg.train.ppo_epochs > 1:
        per += f" × {cfg.train.ppo_epochs} epochs"
    if cfg.mode == "sync":
        return f"{lag.steps_and_versions()}, {per} − 1"
    return (f"{lag.steps_and_versions()}, (staleness {cfg.async_.max_weight_staleness} + 1) × interval "
            f"{cfg.async_.update_weights_interval} × {per} − 1")


def set_keys(cfg: FasyncConfig) -> set[str]:
    """The dotted keys some layer of the config writes (the rest are defaults)."""
    keys = set()
    for name in cfg.model_fields_set:
        section = getattr(cfg, name)
        alias = type(cfg).model_fields[name].alias or name
        fields = getattr(section, "model_fields_set", None)
        keys.update({f"{alias}.{field}" for field in fields} if fields is not None else {alias})
    return keys


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def rejects(cfg: FasyncConfig) -> bool:
    """Whether a rejection mask is set: tokens or sequences too far off-policy are masked out of the loss
    (verl's rejection-sampling mode), which is an off-policy correction even without importance weights."""
    correction = cfg.correction
    return any(v is not None for v in (correction.reject_token_ratio, correction.reject_sequence_ratio,
                                       correction.reject_kl))


def uncorrected(cfg: FasyncConfig, derived: Derived) -> bool:
    """Nothing in the loss accounts for which policy sampled a token: no importance weights, no rejection
    mask, and a PPO ratio anchored elsewhere than the behaviour logprobs."""
    return cfg.correction.level == "none" and not rejects(cfg) and derived.ratio_anchor != "behaviour"


def uncorrected_partial_rollout(cfg: FasyncConfig, derived: Derived) -> bool:
    """fully_async partial rollouts (samples spanning versions) with nothing weighing the older tokens."""
    return cfg.mode == "fully_async" and cfg.async_.partial_rollout and uncorrected(cfg, derived)

VLLM_MAX_TEMPERATURE = 2.0
"""The highest temperature vLLM's SamplingParams accepts (it rejects the request above it)."""

VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""The attention head sizes vLLM's CPU build (0.32) supports; a model with another fails when its engine starts."""
