"""AReaL (inclusionAI/AReaL): always streams; a YAML config."""

from __future__ import annotations

from fasync.frameworks.common import (
    CONVERTED,
    NESTED,
    NONE,
    SAME,
    Expressed,
    Framework,
    Imported,
    Source,
    geometry,
)

ROWS = [
    ("train_dataset.batch_size", "rollout.batch_size", SAME, "prompts per training step: a fasync drain."),
    ("gconfig.n_samples", "rollout.n_samples_per_prompt", SAME),
    ("gconfig.max_new_tokens", "rollout.max_new_tokens", SAME),
    ("gconfig.temperature", "rollout.temperature", SAME),
    ("gconfig.top_p", "rollout.top_p", SAME),
    ("gconfig.*", (), NONE, "other generation settings have no fasync equivalent."),
    ("actor.ppo_n_minibatches", "train.num_steps_per_rollout", SAME,
     "optimizer steps per training batch: several steps per drain, the lag S001 states."),
    ("actor.optimizer.lr", "train.lr", SAME),
    ("actor.optimizer.weight_decay", "train.weight_decay", SAME),
    ("actor.optimizer.gradient_clipping", "train.grad_clip", SAME),
    ("actor.eps_clip", ("train.clip_eps_low", "train.clip_eps_high"), SAME),
    ("actor.eps_clip_higher", "train.clip_eps_high", SAME),
    ("actor.kl_ctl", "train.kl_coef", SAME),
    ("actor.path", "model.path", SAME, "fasync loads local directories only, never a hub name."),
    ("actor.recompute_logprob", "correction.ratio_anchor", CONVERTED,
     "recomputed logprobs as the PPO ratio's anchor are `ratio_anchor: recompute`."),
    ("actor.use_decoupled_loss", "correction.ratio_anchor", CONVERTED,
     "decoupled PPO is `ratio_anchor: proximal` with `correction.level: token` (its behaviour importance weight)."),
    ("actor.behav_imp_weight_cap", "correction.weight_upper", SAME, "older AReaL: the cap on the behaviour weight."),
    ("actor.rejection_sampling.upper", ("correction.reject_token_ratio", "correction.reject_sequence_ratio"), CONVERTED,
     "tokens (or sequences, level: sequence) whose ratio exceeds it are masked: a rejection interval [0, upper]."),
    ("actor.rejection_sampling.*", (), NONE, "the other rejection settings (metric, action) have no equivalent."),
    ("actor.importance_sampling_level", "correction.level", SAME, "token or sequence."),
    ("actor.*", (), NONE, "engine and logging settings of the actor have no fasync equivalent."),
    ("rollout.max_head_offpolicyness", "async.max_weight_staleness", SAME,
     "both count weight versions; fasync counts from the oldest version that produced any token of a sample, "
     "which under partial rollout is the version that started it, as in AReaL."),
    ("rollout.max_concurrent_rollouts", "async.max_concurrent_samples", CONVERTED,
     "AReaL counts rollout episodes (one per prompt); fasync counts samples: × gconfig.n_samples."),
    ("rollout.queue_size", "async.max_queue_size", SAME, "fasync's queue holds prompt groups."),
    ("rollout.consumer_batch_size", (), NONE, "the drain is rollout.batch_size groups."),
    ("cluster.n_gpus_per_node", "resources.num_gpus", CONVERTED, "n_nodes × n_gpus_per_node."),
    ("cluster.n_nodes", "resources.num_gpus", CONVERTED, "n_nodes × n_gpus_per_node."),
    ("allocation_mode", ("resources.num_rollout_engines", "resources.trainer_ranks"), CONVERTED,
     "e.g. sglang:d4p1t1+fsdp:d4: the data-parallel degrees are the engines and the trainer ranks."),
    ("cluster.*", (), NONE, NESTED.format(source="AReaL")),
    ("train_dataset.*", (), NONE, NESTED.format(source="AReaL")),
    ("saver.*", (), NONE, NESTED.format(source="AReaL")),
    ("total_train_epochs", (), NONE, "passes over the dataset; fasync counts drains (train.num_rollouts)."),
    ("saver.freq_steps", "checkpoint.every", CONVERTED, "AReaL counts global steps (one per batch, of "
     "actor.ppo_n_minibatches updates), fasync optimizer steps: × the optimizer steps per drain."),
    ("stats_logger.wandb.mode", ("logging.backends", "logging.wandb_mode"), CONVERTED,
     "online or offline adds wandb in that mode; disabled (AReaL's default) leaves it out."),
    ("stats_logger.tensorboard.path", "logging.backends", CONVERTED, "adds tensorboard; fasync writes its events under "
     "<run_dir>/tensorboard, not at AReaL's path."),
    ("experiment_name", "logging.experiment", SAME),
    ("seed", "train.seed", SAME),
]


def import_into(source: Source, out: Imported) -> set[str]:
    out.set("mode", "fully_async", "AReaL streams rollouts and syncs weights after every step")
    decoupled = source.get("actor.use_decoupled_loss")
    if decoupled:
        out.set("correction.ratio_anchor", "proximal", f"{source.cite('actor.use_decoupled_loss')}: decoupled PPO")
        out.set("correction.level", "token", "decoupled PPO's behaviour importance weight")
    elif source.get("actor.recompute_logprob"):
        out.set("correction.ratio_anchor", "recompute", source.cite("actor.recompute_logprob"))
    concurrent = source.get("rollout.max_concurrent_rollouts")
    if concurrent is not None:
        n = source.get("gconfig.n_samples", 1)
        out.set("async.max_concurrent_samples", concurrent * n,
                f"{source.cite('rollout.max_concurrent_rollouts')} episodes × {source.cite('gconfig.n_samples', 1)}")
    upper = source.get("actor.rejection_sampling.upper")
    if upper is not None:
        out.set("correction.reject_token_ratio", [0.0, upper], f"{source.cite('actor.rejection_sampling.upper')}: "
                "tokens whose ratio exceeds it are masked")
    trackers = {}
    wandb_mode = source.get("stats_logger.wandb.mode")
    if wandb_mode in ("online", "offline"):
        trackers["wandb"] = source.cite("stats_logger.wandb.mode")
        out.set("logging.wandb_mode", wandb_mode, source.cite("stats_logger.wandb.mode"))
    if source.get("stats_logger.tensorboard.path"):
        trackers["tensorboard"] = source.cite("stats_logger.tensorboard.path")
    out.set_trackers(trackers)
    return {"actor.use_decoupled_loss", "actor.recompute_logprob", "rollout.max_concurrent_rollouts",
            "actor.rejection_sampling.upper", "stats_logger.wandb.mode", "stats_logger.tensorboard.path"}


def express(cfg, derived) -> Expressed:
    prompts, n, per_step, steps, bound, interval = geometry(cfg, derived)
    out = Expressed(FRAMEWORK, "yaml")
    out.put("train_dataset.batch_size", prompts, "rollout.batch_size: prompts per training step")
    out.put("gconfig.n_samples", n, "rollout.n_samples_per_prompt")
    out.put("actor.ppo_n_minibatches", steps, "optimizer steps per drain")
    out.put_streaming_bound(cfg, "rollout.max_head_offpolicyness")
    out.note_trimmed_samples(derived)
    out.note_sync_every_step(interval)
    out.note_algorithm(cfg)
    return out


FRAMEWORK = Framework("areal", "AReaL", ROWS, import_into, express, rollout_checkpoint_keys=("saver.freq_steps",))
