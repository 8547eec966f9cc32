"""Keys that users of other RL frameworks type from habit, and what they are called here.

Each entry names the framework(s), the fasync key(s) and, where the meaning differs, how.
Names are matched after lower-casing and turning `-` into `_`, so slime's and OpenRLHF's
command-line flags (`--rollout-batch-size`) match too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    source: str
    """Where users know the key from."""
    targets: tuple[str, ...]
    """The fasync key(s); empty when fasync has no equivalent."""
    note: str = ""
    """How the meaning differs, or what to do."""


def _m(source: str, *targets: str, note: str = "") -> Migration:
    return Migration(source, targets, note)


_SAMPLES_PER_PROMPT = _m("verl/slime/OpenRLHF/AReaL/TRL", "rollout.n_samples_per_prompt",
                         note="completions per prompt (the GRPO group size); it lives in the `rollout` section.")
_MAX_NEW_TOKENS = _m("verl/slime/OpenRLHF/TRL", "rollout.max_new_tokens",
                     note="the longest completion in tokens, prompt excluded.")
_LR = _m("TRL/OpenRLHF/verl", "train.lr")
_KL = _m("verl/slime/OpenRLHF/TRL", "train.kl_coef",
         note="fasync adds the KL to a frozen reference model to the loss (verl's use_kl_loss, TRL's beta); "
         "a KL penalty folded into the reward (verl's algorithm.kl_ctrl) has no fasync equivalent.")
_BOTH_CLIPS = _m("slime/OpenRLHF/AReaL", "train.clip_eps_low", "train.clip_eps_high",
                 note="fasync sets the two sides of the PPO clip separately: 1 - clip_eps_low .. 1 + clip_eps_high.")
_NESTED = ("a section of {source}'s nested layout; fasync has flat sections (model, data, reward, rollout, "
           "train, async, correction, resources, logging, checkpoint, lint): move each key to its fasync name.")

FOREIGN_KEYS: dict[str, Migration] = {
    # Staleness and weight syncs.
    "staleness_threshold": _m(
        "verl (fully async)", "async.max_weight_staleness",
        note="verl's value is a fraction of one sync's worth of samples that may come from older weights "
        "(0.1: 10% extra), not a count of versions; fasync bounds how many weight versions a sample may lag: "
        "0 is on-policy, 1 is one-step off-policy."),
    "max_head_offpolicyness": _m(
        "AReaL", "async.max_weight_staleness",
        note="both count weight versions; fasync counts from the oldest version that produced any token of a "
        "sample, which under partial rollout is the version that started it, as in AReaL."),
    "max_weight_staleness": _m("slime/miles", "async.max_weight_staleness", note="it lives in the `async` section."),
    "trigger_parameter_sync_step": _m(
        "verl (fully async)", "async.update_weights_interval",
        note="verl counts trainer updates (mini-batches) between syncs; fasync counts rollouts (fully_async: "
        "drains), each of which is num_steps_per_rollout optimizer steps."),
    "update_weights_interval": _m("slime", "async.update_weights_interval", note="it lives in the `async` section."),
    "partial_rollout": _m("verl/slime", "async.partial_rollout", note="it lives in the `async` section."),
    "max_concurrent_rollouts": _m(
        "AReaL", "async.max_concurrent_samples",
        note="AReaL counts rollout episodes; fasync counts samples (completions) generating at once."),
    "queue_size": _m("AReaL", "async.max_queue_size", note="fasync's queue holds prompt groups."),
    # Batch geometry.
    "rollout_batch_size": _m("slime/OpenRLHF", "rollout.batch_size", note="prompts per rollout, same meaning."),
    "train_batch_size": _m(
        "verl/OpenRLHF", "rollout.batch_size", "train.global_batch_size",
        note="verl's data.train_batch_size counts prompts per rollout (fasync: rollout.batch_size); OpenRLHF's "
        "counts samples per optimizer step (fasync: train.global_batch_size)."),
    "ppo_mini_batch_size": _m(
        "verl", "train.global_batch_size",
        note="verl counts prompts and multiplies by rollout.n; fasync counts samples: set train.global_batch_size "
        "to ppo_mini_batch_size × rollout.n_samples_per_prompt."),
    "ppo_micro_batch_size_per_gpu": _m(
        "verl", "train.micro_batch_size", note="samples per forward/backward pass on one rank, same meaning."),
    "ppo_micro_batch_size": _m(
        "verl", "train.micro_batch_size",
        note="verl's un-suffixed value is global across GPUs; fasync's is per rank: divide by resources.trainer_ranks."),
    "micro_train_batch_size": _m("OpenRLHF", "train.micro_batch_size", note="samples per rank per pass, same meaning."),
    "per_device_train_batch_size": _m(
        "TRL", "train.micro_batch_size",
        note="TRL's global batch is this × devices × gradient_accumulation_steps; fasync sets the global batch "
        "directly in train.global_batch_size."),
    "global_batch_size": _m("slime", "train.global_batch_size", note="samples per optimizer step, in `train`."),
    "n_samples_per_prompt": _SAMPLES_PER_PROMPT,
    "n_samples": _SAMPLES_PER_PROMPT,
    "num_generations": _SAMPLES_PER_PROMPT,
    "rollout_n": _SAMPLES_PER_PROMPT,
    "n": _SAMPLES_PER_PROMPT,
    "group_size": _SAMPLES_PER_PROMPT,
    "over_sampling_batch_size": _m(
        "slime", "rollout.over_sampling_batch_size", note="prompts per refill round; it lives in `rollout`."),
    "ppo_epochs": _m(
        "verl", "train.num_steps_per_rollout",
        note="PPO epochs reuse every sample; fasync never trains twice on a sample: num_steps_per_rollout splits "
        "one rollout into distinct global batches."),
    "num_iterations": _m(
        "TRL", "train.num_steps_per_rollout",
        note="TRL's μ reuses each batch; fasync's steps split a rollout into distinct global batches."),
    "use_dynamic_batch_size": _m(
        "verl/slime", note="it packs micro batches by token count; it is not train.use_dynamic_global_batch_size, "
        "which makes each rollout exactly one optimizer step."),
    "num_rollout": _m("slime", "train.num_rollouts"),
    "total_epochs": _m("verl", "train.num_rollouts", note="verl counts passes over the dataset; fasync counts rollouts."),
    # Optimisation and loss.
    "learning_rate": _LR,
    "actor_learning_rate": _LR,
    "kl_loss_coef": _KL,
    "init_kl_coef": _KL,
    "beta": _KL,
    "use_kl_loss": _m("verl", "train.kl_coef", note="fasync uses a KL loss whenever train.kl_coef > 0."),
    "clip_ratio_low": _m("verl", "train.clip_eps_low", note="the same epsilon: the ratio is clipped below at 1 - value."),
    "clip_ratio_high": _m("verl", "train.clip_eps_high", note="the same epsilon: the ratio is clipped above at 1 + value."),
    "clip_ratio": _BOTH_CLIPS,
    "eps_clip": _BOTH_CLIPS,
    "epsilon": _BOTH_CLIPS,
    "eps_clip_high": _m("slime", "train.clip_eps_high"),
    "epsilon_high": _m("TRL", "train.clip_eps_high"),
    "entropy_coeff": _m("verl", "train.entropy_coef"),
    "max_grad_norm": _m("TRL/OpenRLHF", "train.grad_clip"),
    "loss_agg_mode": _m("verl", "train.loss_aggregation", note="`token-mean` is token_mean; `seq-mean-*` is sequence_mean."),
    # Generation.
    "max_response_length": _MAX_NEW_TOKENS,
    "response_length": _MAX_NEW_TOKENS,
    "rollout_max_response_len": _MAX_NEW_TOKENS,
    "max_completion_length": _MAX_NEW_TOKENS,
    "generate_max_len": _MAX_NEW_TOKENS,
    "rollout_temperature": _m("slime", "rollout.temperature"),
    "rollout_top_p": _m("slime", "rollout.top_p"),
    # Off-policy correction.
    "use_tis": _m(
        "slime/verl", "correction.level", "correction.weight_upper",
        note="truncated importance sampling is `correction.level: token` with the cap in correction.weight_upper."),
    "tis_clip": _m("slime", "correction.weight_upper"),
    "tis_clip_low": _m("slime", "correction.weight_lower"),
    "tis_imp_ratio_cap": _m("verl", "correction.weight_upper", note="and set correction.level: token."),
    "behav_imp_weight_cap": _m("AReaL", "correction.weight_upper", note="and set correction.level: token."),
    "use_decoupled_loss": _m("AReaL", "correction.ratio_anchor", note="decoupled PPO is `ratio_anchor: proximal`."),
    "recompute_logprob": _m("AReaL", "correction.ratio_anchor", note="recomputed logprobs are `ratio_anchor: recompute`."),
    # Resources.
    "rollout_num_gpus_per_engine": _m("slime", "resources.gpus_per_engine"),
    "colocate": _m("slime", "resources.colocate", note="it lives in the `resources` section."),
    # Sections of other frameworks' nested layouts.
    "actor_rollout_ref": _m("verl", note=_NESTED.format(source="verl")),
    "async_training": _m("verl (fully async)", note=_NESTED.format(source="verl")),
    "algorithm": _m("verl", note=_NESTED.format(source="verl")),
    "gconfig": _m("AReaL", "rollout", note="AReaL's generation settings map to the `rollout` section."),
    "actor": _m("verl/AReaL", "train", note="the policy's optimisation settings map to the `train` section."),
}


def normalize(name: str) -> str:
    return name.lstrip("-").lower().replace("-", "_")


def migration_for(name: str) -> Migration | None:
    return FOREIGN_KEYS.get(normalize(name))


def describe(key: str, migration: Migration) -> tuple[str, str]:
    """(message, help) for a diagnostic about the foreign key at dotted path `key`."""
    if migration.targets:
        names = " or ".join(f"`{t}`" for t in migration.targets)
        message = f"`{key}` is a {migration.source} key; fasync calls it {names}"
    else:
        message = f"`{key}` is a {migration.source} key with no direct fasync equivalent"
    return message, migration.note or f"rename it to `{migration.targets[0]}`"
