"""OpenRLHF (OpenRLHF/OpenRLHF): synchronous, async (whole rollouts) or partial rollout; argparse flags."""

from __future__ import annotations

from fasync.frameworks.common import (
    CONVERTED,
    NO_CRITIC,
    NONE,
    SAME,
    Choice,
    Expressed,
    Framework,
    Imported,
    Source,
    express_lora,
    geometry,
    import_choices,
    import_lora,
)

ESTIMATORS = ("group_norm is grpo, dr_grpo grpo without the std (train.normalize_advantage_std: false), rloo is rloo, "
              "reinforce is reinforce_plus_plus and reinforce_baseline reinforce_plus_plus_baseline (not fasync's "
              "reinforce_baseline, the batch mean); gae needs a critic.")
ADVANTAGE_ESTIMATOR = {
    "group_norm": {"train.advantage_estimator": "grpo", "train.normalize_advantage_std": True},
    "dr_grpo": {"train.advantage_estimator": "grpo", "train.normalize_advantage_std": False},
    "rloo": {"train.advantage_estimator": "rloo"},
    "reinforce": {"train.advantage_estimator": "reinforce_plus_plus"},
    "reinforce_baseline": {"train.advantage_estimator": "reinforce_plus_plus_baseline"},
}
"""OpenRLHF's estimators as fasync settings, under either spelling of the key."""
LORA_KEYS = ("lora_rank", "lora_alpha", "target_modules")
CHOICES = [Choice("algo.advantage.estimator", ADVANTAGE_ESTIMATOR), Choice("advantage_estimator", ADVANTAGE_ESTIMATOR)]

ROWS = [
    ("rollout.batch_size", "rollout.batch_size", SAME, "prompts per rollout, the same meaning."),
    ("rollout_batch_size", "rollout.batch_size", SAME, "prompts per rollout, the same meaning."),
    ("rollout.n_samples_per_prompt", "rollout.n_samples_per_prompt", SAME),
    ("n_samples_per_prompt", "rollout.n_samples_per_prompt", SAME),
    ("train.batch_size", "train.global_batch_size", SAME,
     "samples per optimizer step, not prompts: train.global_batch_size, not rollout.batch_size."),
    ("train_batch_size", "train.global_batch_size", SAME,
     "samples per optimizer step, not prompts: train.global_batch_size, not rollout.batch_size."),
    ("train.micro_batch_size", "train.micro_batch_size", SAME, "samples per GPU per pass."),
    ("micro_train_batch_size", "train.micro_batch_size", SAME, "samples per GPU per pass."),
    ("train.max_epochs", "train.ppo_epochs", SAME, "passes over each rollout batch, as train.ppo_epochs."),
    ("max_epochs", "train.ppo_epochs", SAME, "passes over each rollout batch, as train.ppo_epochs."),
    ("train.num_episodes", (), NONE, "passes over the prompts; fasync counts rollouts (train.num_rollouts)."),
    ("num_episodes", (), NONE, "passes over the prompts; fasync counts rollouts (train.num_rollouts)."),
    ("train.async_enable", "mode", CONVERTED, "OpenRLHF's async training overlaps whole rollouts: `mode: async`."),
    ("async_train", "mode", CONVERTED, "OpenRLHF's async training overlaps whole rollouts: `mode: async`."),
    ("train.async_queue_size", "async.max_weight_staleness", CONVERTED,
     "rollouts the sampler may queue ahead of the trainer: each is one version staler, so the bound in versions."),
    ("train.partial_rollout_enable", "async.partial_rollout", CONVERTED,
     "OpenRLHF pauses vLLM at a sync and resumes; fasync resumes in-flight generations only in fully_async, so "
     "this becomes `mode: fully_async` with `async.partial_rollout: true`."),
    ("partial_rollout_enable", "async.partial_rollout", CONVERTED,
     "OpenRLHF pauses vLLM at a sync and resumes; fasync resumes in-flight generations only in fully_async, so "
     "this becomes `mode: fully_async` with `async.partial_rollout: true`."),
    ("rollout.max_new_tokens", "rollout.max_new_tokens", SAME),
    ("generate_max_len", "rollout.max_new_tokens", SAME),
    ("rollout.temperature", "rollout.temperature", SAME),
    ("rollout.top_p", "rollout.top_p", SAME),
    ("actor.eps_clip", ("train.clip_eps_low", "train.clip_eps_high"), SAME),
    ("eps_clip", ("train.clip_eps_low", "train.clip_eps_high"), SAME),
    ("actor.eps_clip_low_high", ("train.clip_eps_low", "train.clip_eps_high"), CONVERTED, "two values: low, high."),
    ("algo.kl.init_coef", "train.kl_coef", SAME, "as a loss term (use_kl_loss); in the reward it has no equivalent."),
    ("init_kl_coef", "train.kl_coef", SAME, "as a loss term (use_kl_loss); in the reward it has no equivalent."),
    ("algo.advantage.estimator", ("train.advantage_estimator", "train.normalize_advantage_std"), CONVERTED, ESTIMATORS),
    ("advantage_estimator", ("train.advantage_estimator", "train.normalize_advantage_std"), CONVERTED, ESTIMATORS),
    ("actor.adam.lr", "train.lr", SAME),
    ("actor_learning_rate", "train.lr", SAME),
    ("ckpt.save_steps", "checkpoint.every", CONVERTED, "OpenRLHF counts global steps (rollouts), fasync optimizer "
     "steps: × the optimizer steps per rollout."),
    ("save_steps", "checkpoint.every", CONVERTED, "OpenRLHF counts global steps (rollouts), fasync optimizer steps: × "
     "the optimizer steps per rollout."),
    ("use_wandb", "logging.backends", CONVERTED, "adds wandb to logging.backends (OpenRLHF's value is the W&B key)."),
    ("use_tensorboard", "logging.backends", CONVERTED, "adds tensorboard to logging.backends; fasync writes its events "
     "under <run_dir>/tensorboard, not at OpenRLHF's path."),
    ("wandb_project", "logging.experiment", SAME),
    ("actor.num_gpus_per_node", ("resources.trainer_ranks", "resources.num_gpus"), CONVERTED,
     "actor.num_nodes × actor.num_gpus_per_node trainer GPUs, one rank each."),
    ("actor.num_nodes", ("resources.trainer_ranks", "resources.num_gpus"), CONVERTED, "see actor.num_gpus_per_node."),
    ("actor_num_gpus_per_node", ("resources.trainer_ranks", "resources.num_gpus"), CONVERTED, "one rank per GPU."),
    ("vllm.num_engines", "resources.num_rollout_engines", SAME),
    ("vllm_num_engines", "resources.num_rollout_engines", SAME),
    ("vllm.tensor_parallel_size", "resources.gpus_per_engine", SAME),
    ("vllm_tensor_parallel_size", "resources.gpus_per_engine", SAME),
    ("train.colocate_all", "resources.colocate", SAME),
    ("colocate_all_models", "resources.colocate", SAME),
    ("algo.advantage.is_correction_enable", "correction.level", CONVERTED, "vLLM importance-sampling correction."),
    ("algo.advantage.is_correction_threshold", "correction.weight_upper", CONVERTED, "the upper of its two bounds."),
    ("train.seed", "train.seed", SAME),
    ("critic.*", (), NONE, NO_CRITIC),
    ("actor.model_name_or_path", "model.path", SAME, "fasync loads local directories only, never a hub name."),
    ("pretrain", "model.path", SAME, "fasync loads local directories only, never a hub name."),
    ("lora_rank", "model.lora", CONVERTED, "the adapters' rank; 0 (OpenRLHF's default) is none."),
    ("lora_alpha", "model.lora", CONVERTED, "model.lora.alpha, with lora_rank."),
    ("target_modules", "model.lora", CONVERTED, "model.lora.target_modules; all-linear is null."),
    ("lora_dropout", (), NONE, "fasync's adapters have no dropout: the trainer runs the policy in eval mode."),
]


def import_into(source: Source, out: Imported) -> set[str]:
    converted = import_choices(CHOICES, source, out) | import_lora(source, out, *LORA_KEYS)
    partial = source.get("train.partial_rollout_enable") or source.get("partial_rollout_enable")
    asynchronous = source.get("train.async_enable") or source.get("async_train")
    if partial:
        out.set("mode", "fully_async", "partial rollout: fasync resumes generations across a sync only in fully_async")
        out.set("async.partial_rollout", True, "train.partial_rollout_enable")
    else:
        out.set("mode", "async" if asynchronous else "sync",
                "train.async_enable: whole rollouts overlap training" if asynchronous else "OpenRLHF trains synchronously")
    if asynchronous or partial:
        queue = source.get("train.async_queue_size", 1)
        out.set("async.max_weight_staleness", queue, f"{source.cite('train.async_queue_size', 1)} rollouts ahead")
    trackers = {}
    if source.get("use_wandb"):
        trackers["wandb"] = source.cite("use_wandb")
    if source.get("use_tensorboard"):
        trackers["tensorboard"] = source.cite("use_tensorboard")
    out.set_trackers(trackers)
    return converted | {"train.partial_rollout_enable", "partial_rollout_enable", "train.async_enable", "async_train",
            "train.async_queue_size", "use_wandb", "use_tensorboard"}


def express(cfg, derived) -> Expressed:
    prompts, n, per_step, steps, bound, interval = geometry(cfg, derived)
    out = Expressed(FRAMEWORK, "python3 -m openrlhf.cli.train_ppo_ray")
    out.put("rollout.batch_size", prompts, "rollout.batch_size")
    out.put("rollout.n_samples_per_prompt", n, "rollout.n_samples_per_prompt")
    out.put("train.batch_size", per_step, "samples per optimizer step")
    out.note_trimmed_samples(derived)
    out.note_sync_every_step(interval)
    CHOICES[0].express(cfg, out, "algo.advantage.estimator")
    if cfg.train.ppo_epochs != 1:
        out.put("train.max_epochs", cfg.train.ppo_epochs, "train.ppo_epochs")
    express_lora(cfg, out, *LORA_KEYS)
    out.note_algorithm(cfg, ("train.advantage_estimator", "train.normalize_advantage_std", "train.ppo_epochs",
                             "model.lora"))
    if cfg.mode == "sync":
        return out
    if cfg.mode == "fully_async":
        out.put("train.partial_rollout_enable", True, "fully_async: OpenRLHF streams with partial rollout")
        if not cfg.async_.partial_rollout:
            out.missing.append("fully_async without partial rollout: OpenRLHF streams only with partial rollout")
    else:
        out.put("train.async_enable", True, "mode async")
    out.put("train.async_queue_size", bound if bound is not None else 1, "async.max_weight_staleness")
    if bound is None:
        out.missing.append("no staleness bound: OpenRLHF's queue always holds a number of rollouts")
    return out


FRAMEWORK = Framework("openrlhf", "OpenRLHF", ROWS, import_into, express,
                      rollout_checkpoint_keys=("ckpt.save_steps", "save_steps"))
