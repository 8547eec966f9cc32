"""slime (THUDM/slime): train.py (synchronous) and train_async.py (one rollout ahead); argparse flags."""

from __future__ import annotations

from fasync.frameworks.common import (
    CONVERTED,
    NONE,
    SAME,
    Choice,
    Expressed,
    Framework,
    Imported,
    Source,
    geometry,
    import_choices,
)

ROWS = [
    ("rollout_batch_size", "rollout.batch_size", SAME, "prompts per rollout, the same meaning."),
    ("n_samples_per_prompt", "rollout.n_samples_per_prompt", SAME),
    ("global_batch_size", "train.global_batch_size", SAME, "samples per optimizer step, the same meaning."),
    ("num_steps_per_rollout", "train.num_steps_per_rollout", SAME),
    ("micro_batch_size", "train.micro_batch_size", SAME),
    ("num_rollout", "train.num_rollouts", SAME),
    ("update_weights_interval", "async.update_weights_interval", SAME, "rollouts between weight syncs in both."),
    ("partial_rollout", "async.partial_rollout", SAME, "fasync resumes generations across a sync only in fully_async."),
    ("over_sampling_batch_size", "rollout.over_sampling_batch_size", SAME),
    ("rollout_max_response_len", "rollout.max_new_tokens", SAME),
    ("rollout_temperature", "rollout.temperature", SAME),
    ("rollout_top_p", "rollout.top_p", SAME),
    ("lr", "train.lr", SAME),
    ("weight_decay", "train.weight_decay", SAME),
    ("clip_grad", "train.grad_clip", SAME),
    ("eps_clip", ("train.clip_eps_low", "train.clip_eps_high"), SAME, "the upper side unless eps_clip_high is set."),
    ("eps_clip_high", "train.clip_eps_high", SAME),
    ("use_kl_loss", "train.kl_coef", CONVERTED, "fasync adds the KL loss whenever train.kl_coef > 0."),
    ("kl_loss_coef", "train.kl_coef", CONVERTED, "counts only with use_kl_loss."),
    ("kl_coef", (), NONE, "slime's kl_coef folds a KL penalty into the reward: no fasync equivalent."),
    ("entropy_coef", "train.entropy_coef", SAME),
    ("advantage_estimator", ("train.advantage_estimator", "train.importance_ratio"), CONVERTED,
     "grpo, reinforce_plus_plus and reinforce_plus_plus_baseline are the same estimators; gspo is grpo with "
     "GSPO's sequence ratio (train.importance_ratio: sequence); ppo needs a critic."),
    ("lr_warmup_iters", "train.lr_warmup_steps", SAME, "Megatron's iterations are optimizer steps."),
    ("lr_decay_style", "train.lr_schedule", CONVERTED,
     "constant, linear and cosine are the same shapes (Megatron decays to min_lr over lr_decay_iters, fasync to 0 "
     "at the end of the run); inverse-square-root and WSD have no equivalent."),
    ("normalize_advantages", "train.normalize_advantage_std", SAME),
    ("use_tis", "correction.level", CONVERTED,
     "truncated importance sampling is `correction.level: token` with the cap in correction.weight_upper."),
    ("tis_clip", "correction.weight_upper", SAME),
    ("tis_clip_low", "correction.weight_lower", SAME),
    ("rollout_num_gpus", ("resources.num_rollout_engines", "resources.num_gpus"), CONVERTED,
     "GPUs for inference in total, not a rollout setting: fasync has rollout_num_gpus / "
     "rollout_num_gpus_per_engine engines."),
    ("rollout_num_gpus_per_engine", "resources.gpus_per_engine", SAME),
    ("actor_num_gpus_per_node", ("resources.trainer_ranks", "resources.num_gpus"), CONVERTED,
     "actor_num_nodes × actor_num_gpus_per_node trainer GPUs, one rank each."),
    ("actor_num_nodes", ("resources.trainer_ranks", "resources.num_gpus"), CONVERTED, "see actor_num_gpus_per_node."),
    ("colocate", "resources.colocate", SAME),
    ("save_interval", "checkpoint.every", CONVERTED, "slime counts rollouts, fasync optimizer steps: × the optimizer steps per rollout."),
    ("use_wandb", "logging.backends", CONVERTED, "adds wandb to logging.backends."),
    ("wandb_project", "logging.experiment", SAME),
    ("use_dynamic_batch_size", (), NONE,
     "it packs micro batches by token count; it is not train.use_dynamic_global_batch_size."),
    ("num_epoch", (), NONE, "passes over the dataset; fasync counts rollouts (train.num_rollouts)."),
    ("seed", "train.seed", SAME),
]


CHOICES = [
    Choice("advantage_estimator", {
        "gspo": {"train.advantage_estimator": "grpo", "train.importance_ratio": "sequence"},
        **{name: {"train.advantage_estimator": name, "train.importance_ratio": "token"}
           for name in ("grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")}}),
    Choice("lr_decay_style", {name: {"train.lr_schedule": name} for name in ("constant", "linear", "cosine")}),
]
"""slime's (and miles's) flags whose values name an algorithm."""


def import_into(source: Source, out: Imported) -> set[str]:
    """slime's, and miles's, which adds `--fully-async`."""
    converted = import_choices(CHOICES, source, out)
    if source.get("fully_async"):
        out.set("mode", "fully_async", f"{source.cite('fully_async')}")
    elif source.script.endswith("train_async.py"):
        out.set("mode", "async", f"{source.script} overlaps the next rollout with training (one step off)")
        if "async.max_weight_staleness" not in out.values:
            out.set("async.max_weight_staleness", 1, f"{source.script}: one rollout ahead")
    else:
        out.set("mode", "sync", f"{source.script or 'train.py'} trains each rollout before the next")
    if source.get("use_kl_loss"):
        out.set("train.kl_coef", source.get("kl_loss_coef", 0.0), f"use_kl_loss with {source.cite('kl_loss_coef', 0.0)}")
    if source.get("use_tis"):
        out.set("correction.level", "token", f"{source.cite('use_tis')}: truncated importance sampling per token")
    if source.get("use_wandb"):
        out.set_trackers({"wandb": source.cite("use_wandb")})
    return converted | {"fully_async", "use_kl_loss", "kl_loss_coef", "use_tis", "use_wandb"}


def express(cfg, derived) -> Expressed:
    out = express_flags(FRAMEWORK, cfg, derived)
    if cfg.mode == "fully_async":
        out.missing.append("mode fully_async: slime overlaps one rollout (train_async.py); miles streams")
    return out


def express_flags(framework: Framework, cfg, derived) -> Expressed:
    """What slime and miles write alike: every mode but fully_async."""
    prompts, n, per_step, steps, bound, interval = geometry(cfg, derived)
    script = {"sync": "train.py", "async": "train_async.py", "fully_async": "train_async.py"}[cfg.mode]
    out = Expressed(framework, f"python3 {script}")
    out.put("rollout-batch-size", prompts, "rollout.batch_size")
    out.put("n-samples-per-prompt", n, "rollout.n_samples_per_prompt")
    out.put("global-batch-size", per_step, "samples per optimizer step")
    out.put("num-steps-per-rollout", steps, "optimizer steps per rollout")
    out.put("num-rollout", cfg.train.num_rollouts, "train.num_rollouts")
    out.put("update-weights-interval", interval, "async.update_weights_interval")
    for choice, flag in zip(CHOICES, ("advantage-estimator", "lr-decay-style")):
        choice.express(cfg, out, flag)
    if cfg.train.lr_warmup_steps:
        out.put("lr-warmup-iters", cfg.train.lr_warmup_steps, "train.lr_warmup_steps")
    out.note_algorithm(cfg, ("train.advantage_estimator", "train.importance_ratio", "train.lr_warmup_steps",
                             "train.lr_schedule"))
    out.note_trimmed_samples(derived)
    if cfg.mode == "async" and bound != 1:
        out.missing.append(f"async.max_weight_staleness {bound}: {framework.display}'s train_async.py runs "
                           "exactly one rollout ahead")
    return out


FRAMEWORK = Framework("slime", "slime", ROWS, import_into, express, rollout_checkpoint_keys=("save_interval",))
