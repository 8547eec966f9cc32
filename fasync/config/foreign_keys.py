"""Keys of other RL frameworks and what they are in fasync: one table for the loader's hints (F008), the
linter's reading of a foreign config, and the equivalence tables of docs/migrate.md.

Each row names a framework, the key as that framework writes it (a dotted path in its config, or an
argparse flag without its dashes, `-` read as `_`), the fasync key(s) it feeds, how (the same value, a
value converted by the framework's own semantics, or no equivalent) and, where the meaning differs, how.
Checked against each framework's sources (verl, slime, miles, AReaL, prime-rl, OpenRLHF, TRL; see
docs/migrate.md for the versions read).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

SAME, CONVERTED, NONE = "same", "converted", "none"
"""The value carries over as it is; it is converted (arithmetic, units, other keys); fasync has no equivalent."""

FRAMEWORKS = {"verl": "verl", "slime": "slime", "miles": "miles", "areal": "AReaL", "prime-rl": "prime-rl",
              "openrlhf": "OpenRLHF", "trl": "TRL"}
"""Framework ids → display names."""


@dataclass(frozen=True)
class KeyMapping:
    framework: str
    source: str
    """The key in the framework's spelling, normalised (`--rollout-batch-size` is `rollout_batch_size`); a
    trailing `.*` covers a whole section."""
    targets: tuple[str, ...]
    kind: str
    note: str = ""

    @property
    def display(self) -> str:
        return FRAMEWORKS[self.framework]


def _table(framework: str, rows: Iterable[tuple]) -> list[KeyMapping]:
    out = []
    for source, targets, kind, *note in rows:
        targets = (targets,) if isinstance(targets, str) else tuple(targets)
        out.append(KeyMapping(framework, source, targets, kind, note[0] if note else ""))
    return out


_NO_CRITIC = ("fasync has no critic: its advantages (grpo, reinforce_baseline) need no value model, so the "
              "critic's settings have no equivalent.")
_NESTED = ("a section of {source}'s nested layout; fasync has flat sections (model, data, reward, rollout, "
           "train, async, correction, resources, logging, checkpoint, lint): each key that has a fasync equivalent "
           "maps on its own (docs/migrate.md lists them).")
_EPOCHS = ("PPO epochs train every sample again; fasync trains each sample once (several steps split a rollout "
           "into distinct batches): no equivalent, fasync behaves as 1.")

_VERL = _table("verl", [
    ("data.train_batch_size", "rollout.batch_size", SAME,
     "prompts per rollout, as in fasync; the fully-async recipe ignores it (0): a drain is "
     "require_batches × ppo_mini_batch_size prompts."),
    ("data.max_response_length", "rollout.max_new_tokens", SAME),
    ("data.train_files", "data.path", CONVERTED, "verl reads parquet; fasync reads a JSONL file of prompt/label objects."),
    ("data.max_prompt_length", (), NONE, "fasync does not truncate prompts."),
    ("actor_rollout_ref.rollout.n", "rollout.n_samples_per_prompt", SAME),
    ("actor_rollout_ref.rollout.response_length", "rollout.max_new_tokens", SAME),
    ("actor_rollout_ref.rollout.temperature", "rollout.temperature", SAME),
    ("actor_rollout_ref.rollout.top_p", "rollout.top_p", SAME),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "resources.gpus_per_engine", SAME),
    ("actor_rollout_ref.rollout.name", "rollout.engine", CONVERTED, "vllm is `rollout.engine: vllm`; sglang has no equivalent."),
    ("actor_rollout_ref.model.path", "model.path", SAME, "fasync loads local directories only, never a hub name."),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "train.global_batch_size", CONVERTED,
     "verl counts prompts and multiplies by rollout.n; fasync counts samples: train.global_batch_size = "
     "ppo_mini_batch_size × rollout.n_samples_per_prompt."),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "train.micro_batch_size", SAME,
     "samples per forward/backward pass on one rank."),
    ("actor_rollout_ref.actor.ppo_micro_batch_size", "train.micro_batch_size", CONVERTED,
     "verl's un-suffixed value is global across GPUs; fasync's is per rank: divide by resources.trainer_ranks."),
    ("actor_rollout_ref.actor.ppo_epochs", (), NONE, _EPOCHS),
    ("actor_rollout_ref.actor.use_kl_loss", "train.kl_coef", CONVERTED,
     "fasync adds the KL to a reference model to the loss whenever train.kl_coef > 0: false is kl_coef 0."),
    ("actor_rollout_ref.actor.kl_loss_coef", "train.kl_coef", CONVERTED, "counts only with use_kl_loss."),
    ("actor_rollout_ref.actor.clip_ratio", ("train.clip_eps_low", "train.clip_eps_high"), SAME),
    ("actor_rollout_ref.actor.clip_ratio_low", "train.clip_eps_low", SAME),
    ("actor_rollout_ref.actor.clip_ratio_high", "train.clip_eps_high", SAME),
    ("actor_rollout_ref.actor.entropy_coeff", "train.entropy_coef", SAME),
    ("actor_rollout_ref.actor.loss_agg_mode", "train.loss_aggregation", CONVERTED,
     "token-mean is token_mean, seq-mean-token-mean is sequence_mean; the other modes have no equivalent."),
    ("actor_rollout_ref.actor.optim.lr", "train.lr", SAME),
    ("actor_rollout_ref.actor.optim.weight_decay", "train.weight_decay", SAME),
    ("actor_rollout_ref.actor.grad_clip", "train.grad_clip", SAME),
    ("actor_rollout_ref.actor.use_dynamic_bsz", (), NONE,
     "it packs micro batches by token count; it is not train.use_dynamic_global_batch_size, which makes each "
     "rollout exactly one optimizer step."),
    ("actor_rollout_ref.actor.use_rollout_log_probs", "correction.ratio_anchor", CONVERTED,
     "the PPO ratio against the rollout's logprobs is `ratio_anchor: behaviour`."),
    ("algorithm.adv_estimator", "train.advantage_estimator", CONVERTED,
     "grpo is grpo; gae needs a critic, and rloo, reinforce_plus_plus and remax have no equivalent "
     "(reinforce_baseline subtracts the batch mean)."),
    ("algorithm.norm_adv_by_std_in_grpo", "train.normalize_advantage_std", SAME),
    ("algorithm.use_kl_in_reward", (), NONE, "a KL penalty folded into the reward has no fasync equivalent."),
    ("algorithm.kl_ctrl.*", (), NONE, "a KL penalty folded into the reward has no fasync equivalent."),
    ("algorithm.rollout_correction.rollout_is", "correction.level", CONVERTED,
     "token and sequence are the same levels; null is none."),
    ("algorithm.rollout_correction.rollout_is_threshold", "correction.weight_upper", SAME,
     "the truncation cap of the importance weights."),
    ("algorithm.rollout_correction.rollout_is_batch_normalize", "correction.batch_normalize", SAME),
    ("algorithm.rollout_correction.rollout_rs", ("correction.reject_token_ratio", "correction.reject_sequence_ratio",
                                                  "correction.reject_kl"), CONVERTED,
     "verl's rejection modes (token_k1, seq_mean_k3, ...) mask by a ratio or KL estimate; fasync masks tokens "
     "or sequences whose ratio leaves [low, high], or sequences whose mean k3 KL exceeds reject_kl."),
    ("algorithm.rollout_correction.rollout_rs_threshold", ("correction.reject_token_ratio",
                                                            "correction.reject_sequence_ratio", "correction.reject_kl"),
     CONVERTED, "the bound of the rejection mode above."),
    ("algorithm.rollout_correction.bypass_mode", "correction.ratio_anchor", CONVERTED,
     "bypass (two policies) is `ratio_anchor: behaviour`; decoupled (three policies) is `ratio_anchor: proximal`."),
    ("algorithm.rollout_correction.loss_type", (), NONE,
     "ppo_clip in bypass mode is fasync's behaviour anchor; reinforce (no clip) has no equivalent."),
    ("critic.*", (), NONE, _NO_CRITIC),
    ("actor_rollout_ref.*", (), NONE, _NESTED.format(source="verl")),
    ("algorithm.*", (), NONE, _NESTED.format(source="verl")),
    ("async_training.*", (), NONE, _NESTED.format(source="verl's fully-async recipe")),
    ("trainer.n_gpus_per_node", ("resources.trainer_ranks", "resources.num_gpus"), CONVERTED,
     "nnodes × n_gpus_per_node trainer ranks of one GPU each; outside the fully-async recipe the rollout "
     "shares them (hybrid engine: resources.colocate)."),
    ("trainer.nnodes", ("resources.trainer_ranks", "resources.num_gpus"), CONVERTED, "see trainer.n_gpus_per_node."),
    ("trainer.total_training_steps", "train.num_rollouts", SAME, "one training step per rollout, as in fasync sync."),
    ("trainer.total_epochs", (), NONE, "verl counts passes over the dataset; fasync counts rollouts (train.num_rollouts)."),
    ("trainer.save_freq", "checkpoint.every", CONVERTED,
     "verl counts training steps (one per rollout), fasync optimizer steps: × the optimizer steps per rollout."),
    ("trainer.logger", "logging.backends", CONVERTED, "wandb, tensorboard and mlflow carry over; console is fasync's "
     "progress display, always on."),
    ("trainer.project_name", "logging.experiment", SAME),
    ("trainer.*", (), NONE, "logging, validation and experiment bookkeeping have no fasync equivalent."),
    ("async_training.staleness_threshold", "async.max_weight_staleness", CONVERTED,
     "verl's value is a fraction of one sync's worth of samples the rollouter may generate in excess (0.1: 10% "
     "extra), not a count of versions; those samples can be trained one sync later, so fasync's bound is the "
     "threshold rounded up: 0 stays 0 (synchronous), 0 < t ≤ 1 is 1 version, and every sample, not a fraction, "
     "may then be that old."),
    ("async_training.trigger_parameter_sync_step", "async.update_weights_interval", SAME,
     "verl counts the trainer's fetches of require_batches × ppo_mini_batch_size prompts between weight syncs, "
     "each fetch being one fasync drain: the same count, not a count of mini-batches or optimizer steps."),
    ("async_training.require_batches", ("rollout.batch_size", "train.num_steps_per_rollout"), CONVERTED,
     "the trainer fetches require_batches mini-batches at once and takes one optimizer step per mini-batch: a "
     "fasync drain of require_batches × ppo_mini_batch_size prompts in require_batches optimizer steps."),
    ("async_training.partial_rollout", "async.partial_rollout", SAME),
    ("async_training.use_rollout_log_probs", "correction.ratio_anchor", CONVERTED,
     "true takes the PPO ratio against the rollout's logprobs (`ratio_anchor: behaviour`); false recomputes them "
     "(`recompute`)."),
    ("async_training.compute_prox_log_prob", "correction.ratio_anchor", CONVERTED,
     "true adds a proximal policy recomputed by the trainer: decoupled PPO, `ratio_anchor: proximal` (with "
     "`correction.level: token` for its weights)."),
    ("async_training.checkpoint_engine.*", (), NONE, "fasync syncs weights through Ray; there is nothing to tune."),
    ("rollout.n_gpus_per_node", ("resources.num_rollout_engines", "resources.num_gpus"), CONVERTED,
     "the fully-async recipe's rollout GPUs: engines of tensor_model_parallel_size GPUs each."),
    ("rollout.nnodes", ("resources.num_rollout_engines", "resources.num_gpus"), CONVERTED, "see rollout.n_gpus_per_node."),
    ("rollout.total_rollout_steps", "train.num_rollouts", CONVERTED,
     "verl counts prompts generated; fasync counts drains: total_rollout_steps / (require_batches × ppo_mini_batch_size)."),
    ("rollout.test_freq", (), NONE, "fasync does not validate during a run."),
])

_SLIME_SHARED = [
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
    ("advantage_estimator", "train.advantage_estimator", CONVERTED,
     "grpo is grpo; reinforce_plus_plus and gspo have no equivalent."),
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
_SLIME = _table("slime", _SLIME_SHARED)
_MILES = _table("miles", _SLIME_SHARED + [
    ("fully_async", "mode", CONVERTED, "miles's fully async rollout is `mode: fully_async`."),
    ("max_weight_staleness", "async.max_weight_staleness", SAME,
     "both count weight versions from the oldest version of a group; miles recycles stale groups, fasync drops "
     "them (or regenerates them: async.stale_policy)."),
    ("async_max_concurrent_samples", "async.max_concurrent_samples", SAME),
    ("async_data_buffer_capacity_factor", "async.max_queue_size", CONVERTED,
     "a multiple of rollout_batch_size; fasync counts groups: floor(factor × rollout_batch_size)."),
    ("async_unused_samples_handler", "async.stale_policy", CONVERTED, "retry is regenerate, drop is drop."),
])

_AREAL = _table("areal", [
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
    ("cluster.*", (), NONE, _NESTED.format(source="AReaL")),
    ("train_dataset.*", (), NONE, _NESTED.format(source="AReaL")),
    ("saver.*", (), NONE, _NESTED.format(source="AReaL")),
    ("total_train_epochs", (), NONE, "passes over the dataset; fasync counts drains (train.num_rollouts)."),
    ("saver.freq_steps", "checkpoint.every", CONVERTED, "AReaL counts global steps (one per batch, of "
     "actor.ppo_n_minibatches updates), fasync optimizer steps: × the optimizer steps per drain."),
    ("stats_logger.wandb.mode", ("logging.backends", "logging.wandb_mode"), CONVERTED,
     "online or offline adds wandb in that mode; disabled (AReaL's default) leaves it out."),
    ("stats_logger.tensorboard.path", "logging.backends", CONVERTED, "adds tensorboard; fasync writes its events under "
     "<run_dir>/tensorboard, not at AReaL's path."),
    ("experiment_name", "logging.experiment", SAME),
    ("seed", "train.seed", SAME),
])

_PRIME_RL = _table("prime-rl", [
    ("orchestrator.batch_size", ("train.global_batch_size", "rollout.batch_size"), CONVERTED,
     "samples (not prompts) per step: train.global_batch_size as it is, rollout.batch_size = batch_size / group_size."),
    ("orchestrator.group_size", "rollout.n_samples_per_prompt", SAME),
    ("orchestrator.rollouts_per_example", "rollout.n_samples_per_prompt", SAME, "older prime-rl's name."),
    ("orchestrator.max_off_policy_steps", "async.max_weight_staleness", SAME,
     "both count weight versions between the trained step and the oldest version that generated a rollout, "
     "queue time included; past it prime-rl drops, as fasync's stale_policy drop."),
    ("orchestrator.async_level", "async.max_weight_staleness", SAME, "older prime-rl's name."),
    ("max_async_level", "async.max_weight_staleness", SAME, "older prime-rl's name."),
    ("max_steps", "train.num_rollouts", SAME, "one optimizer step per batch: a fasync drain."),
    ("orchestrator.train.sampling.max_completion_tokens", "rollout.max_new_tokens", SAME),
    ("orchestrator.sampling.max_tokens", "rollout.max_new_tokens", SAME, "older prime-rl's name."),
    ("orchestrator.train.sampling.temperature", "rollout.temperature", SAME),
    ("orchestrator.sampling.temperature", "rollout.temperature", SAME),
    ("trainer.optim.lr", "train.lr", SAME),
    ("trainer.optim.weight_decay", "train.weight_decay", SAME),
    ("trainer.optim.max_norm", "train.grad_clip", SAME),
    ("deployment.num_train_gpus", ("resources.trainer_ranks", "resources.num_gpus"), CONVERTED, "one rank per GPU."),
    ("deployment.num_infer_gpus", ("resources.num_rollout_engines", "resources.num_gpus"), CONVERTED,
     "one engine per GPU."),
    ("model.name", "model.path", CONVERTED, "a hub name; fasync loads a local directory."),
    ("seq_len", (), NONE, "prime-rl's training sequence length; fasync pads each micro batch to its longest sample."),
    ("orchestrator.*", (), NONE, "environment and transport settings have no fasync equivalent."),
    ("ckpt.*", "checkpoint.save_final", CONVERTED, "a [ckpt] section saves checkpoints."),
    ("deployment.*", (), NONE, _NESTED.format(source="prime-rl")),
    ("monitors.*", (), NONE, "monitoring has no fasync equivalent (fasync writes metrics.jsonl)."),
])

_OPENRLHF = _table("openrlhf", [
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
    ("train.max_epochs", (), NONE, _EPOCHS),
    ("max_epochs", (), NONE, _EPOCHS),
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
    ("algo.advantage.estimator", "train.advantage_estimator", CONVERTED,
     "group_norm is grpo; gae needs a critic; rloo and reinforce_baseline variants differ from fasync's batch mean."),
    ("advantage_estimator", "train.advantage_estimator", CONVERTED,
     "group_norm is grpo; gae needs a critic; rloo and reinforce_baseline variants differ from fasync's batch mean."),
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
    ("critic.*", (), NONE, _NO_CRITIC),
    ("actor.model_name_or_path", "model.path", SAME, "fasync loads local directories only, never a hub name."),
    ("pretrain", "model.path", SAME, "fasync loads local directories only, never a hub name."),
])

_TRL = _table("trl", [
    ("num_generations", "rollout.n_samples_per_prompt", SAME),
    ("per_device_train_batch_size", "train.micro_batch_size", SAME,
     "TRL's global batch is this × processes × gradient_accumulation_steps; fasync sets it in train.global_batch_size."),
    ("gradient_accumulation_steps", "train.global_batch_size", CONVERTED,
     "per_device_train_batch_size × processes × gradient_accumulation_steps samples per optimizer step."),
    ("steps_per_generation", ("rollout.batch_size", "train.num_steps_per_rollout"), CONVERTED,
     "TRL generates once every steps_per_generation micro-steps: generation_batch_size = per_device_train_batch_size "
     "× processes × steps_per_generation samples, trained in steps_per_generation / gradient_accumulation_steps "
     "optimizer steps: several steps per generation when it exceeds gradient_accumulation_steps."),
    ("generation_batch_size", ("rollout.batch_size", "train.num_steps_per_rollout"), CONVERTED,
     "samples per generation: rollout.batch_size = generation_batch_size / num_generations."),
    ("num_iterations", (), NONE, "TRL's μ reuses each batch; fasync trains each sample once."),
    ("beta", "train.kl_coef", SAME),
    ("epsilon", ("train.clip_eps_low", "train.clip_eps_high"), SAME),
    ("epsilon_high", "train.clip_eps_high", SAME),
    ("max_completion_length", "rollout.max_new_tokens", SAME),
    ("learning_rate", "train.lr", SAME),
    ("weight_decay", "train.weight_decay", SAME),
    ("max_grad_norm", "train.grad_clip", SAME),
    ("temperature", "rollout.temperature", SAME),
    ("top_p", "rollout.top_p", SAME),
    ("loss_type", "train.loss_aggregation", CONVERTED,
     "grpo averages per sequence (sequence_mean); dapo and bnpo per token (token_mean); dr_grpo has no equivalent."),
    ("scale_rewards", "train.normalize_advantage_std", CONVERTED, "group (or true) is true, none (or false) false; "
     "batch has no equivalent."),
    ("vllm_importance_sampling_correction", "correction.level", CONVERTED,
     "TRL's truncated importance sampling against vLLM's logprobs is `correction.level: token`."),
    ("vllm_importance_sampling_cap", "correction.weight_upper", SAME),
    ("vllm_importance_sampling_clip_max", "correction.weight_upper", SAME),
    ("max_steps", "train.num_rollouts", CONVERTED, "optimizer steps; fasync counts rollouts: / steps per generation."),
    ("save_steps", "checkpoint.every", SAME, "optimizer steps in both."),
    ("report_to", "logging.backends", CONVERTED, "wandb, tensorboard and mlflow carry over (all: the three); none: "
     "metrics.jsonl only, which fasync always writes."),
    ("seed", "train.seed", SAME),
    ("use_vllm", "rollout.engine", CONVERTED, "true is `rollout.engine: vllm`."),
    ("max_staleness", "async.max_weight_staleness", SAME,
     "TRL's async GRPO counts weight updates a sample may lag before it is dropped: versions, as fasync (whose "
     "fully_async drops them too)."),
    ("weight_sync_steps", "async.update_weights_interval", CONVERTED,
     "TRL counts optimizer steps between syncs, fasync drains: weight_sync_steps / (steps_per_generation / "
     "gradient_accumulation_steps) optimizer steps per drain."),
    ("queue_maxsize", "async.max_queue_size", CONVERTED, "TRL counts samples, fasync groups: / num_generations."),
    ("max_inflight_tasks", "async.max_concurrent_samples", SAME, "generation requests in flight, one sample each."),
])

TABLE: list[KeyMapping] = _VERL + _SLIME + _MILES + _AREAL + _PRIME_RL + _OPENRLHF + _TRL

_GENERIC = {"batch_size", "n", "lr", "seed", "temperature", "top_p", "path", "name", "micro_batch_size",
            "max_new_tokens", "max_tokens", "weight_decay", "max_steps", "group_size", "beta", "epsilon"}
"""Leaf names too common to be matched on their own: only a longer path identifies them."""


def normalize(name: str) -> str:
    """`--rollout-batch-size`, `+actor_rollout_ref.x`, `~trainer.logger` → the table's spelling."""
    return name.lstrip("-+~").lower().replace("-", "_")


def _score(row: KeyMapping, path: tuple[str, ...]) -> float:
    """How well the row identifies a key at `path`: the number of trailing segments they share, when those
    are the whole of one of them or at least two (a bare common leaf such as `n` identifies nothing); a section
    row (`critic.*`) covers itself and the keys below it, just below a row that names the key. 0: no match."""
    source = tuple(row.source.split("."))
    if source[-1] == "*":
        prefix = source[:-1]
        return len(path) - 0.5 if path[: len(prefix)] == prefix else 0
    shared = 0
    while shared < min(len(source), len(path)) and source[-shared - 1] == path[-shared - 1]:
        shared += 1
    if shared == 0 or (shared == 1 and len(source) > 1 and path[-1] in _GENERIC):
        return 0
    return shared


def mappings_for(path: Iterable[str], framework: str | None = None) -> list[KeyMapping]:
    """The rows that best describe a foreign key at dotted `path` (its full path, or the longest trailing part
    of it, in some framework's table); only `framework`'s rows when it is known and has one."""
    normalized = tuple(normalize(str(p)) for p in path)
    scored = [(score, row) for row in TABLE if (score := _score(row, normalized))]
    if framework is not None and any(row.framework == framework for _, row in scored):
        scored = [(score, row) for score, row in scored if row.framework == framework]
    best = max((score for score, _ in scored), default=0)
    return [row for score, row in scored if score == best]


def detect(paths: Iterable[tuple[str, ...]]) -> str | None:
    """The framework whose table names at least three of these key paths and two thirds of those any table
    names, or None (a handful of habits from several frameworks is no framework's config)."""
    votes: Counter = Counter()
    named = 0
    for path in paths:
        frameworks = {row.framework for row in mappings_for(path)}
        named += bool(frameworks)
        votes.update(frameworks)
    if not votes:
        return None
    framework, count = votes.most_common(1)[0]
    return framework if count >= 3 and 3 * count >= 2 * named else None


def describe(key: str, rows: list[KeyMapping]) -> tuple[str, str]:
    """(message, help) for a diagnostic about the foreign key at dotted path `key`."""
    frameworks = "/".join(dict.fromkeys(row.display for row in rows))
    targets = list(dict.fromkeys(t for row in rows for t in row.targets))
    if not targets:
        message = f"`{key}` comes from {frameworks} and has no fasync equivalent"
    else:
        names = " or ".join(f"`{t}`" for t in targets)
        message = f"`{key}` comes from {frameworks}; fasync's is {names}"
    notes = list(dict.fromkeys(row.note for row in rows if row.note))
    if len(rows) > 1 and len(notes) > 1:
        help = " ".join(f"{row.display}: {row.note}" for row in rows if row.note)
    else:
        help = notes[0] if notes else f"rename it to `{targets[0]}`"
    return message, help
