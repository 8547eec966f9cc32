"""verl (volcengine/verl): its PPO trainer (synchronous) and its fully-async recipe (`async_training.*`)."""

from __future__ import annotations

import math

import yaml

from fasync.frameworks.common import (
    ADAPT,
    ALGORITHM_SETTINGS,
    CONVERTED,
    NESTED,
    NO_CRITIC,
    NONE,
    SAME,
    TRACKERS,
    Choice,
    Expressed,
    Framework,
    Imported,
    ImportFailure,
    Source,
    express_lora,
    geometry,
    import_choices,
    import_lora,
    module_function,
)

ROWS = [
    ("data.train_batch_size", "rollout.batch_size", SAME,
     "prompts per rollout, as in fasync; the fully-async recipe ignores it (0): a drain is "
     "require_batches × ppo_mini_batch_size prompts."),
    ("data.max_response_length", "rollout.max_new_tokens", SAME),
    ("data.train_files", "data.path", CONVERTED, "fasync reads verl's parquet as it is (chat-message `prompt`, "
     "`reward_model.ground_truth`, `data_source`, `extra_info`); set data.path to one file, as a list is not read."),
    ("data.prompt_key", "data.prompt_key", SAME),
    ("data.max_prompt_length", (), NONE, "fasync does not truncate prompts; data.max_prompt_tokens with "
     "data.overlong_prompts: filter drops longer ones, as data.filter_overlong_prompts does."),
    ("data.filter_overlong_prompts", "data.overlong_prompts", CONVERTED, "true is `filter` (with "
     "data.max_prompt_tokens as the limit); false is `fail`: fasync never trains on a prompt that does not fit."),
    ("custom_reward_function.path", "reward.function", CONVERTED, "`module:function`: the file beside the config, "
     "in the working directory or on PYTHONPATH, named by its module; verl's compute_score signature works as it is."),
    ("custom_reward_function.name", "reward.function", CONVERTED, "the part after the colon (verl's default: "
     "compute_score)."),
    ("actor_rollout_ref.rollout.n", "rollout.n_samples_per_prompt", SAME),
    ("actor_rollout_ref.rollout.response_length", "rollout.max_new_tokens", SAME),
    ("actor_rollout_ref.rollout.temperature", "rollout.temperature", SAME),
    ("actor_rollout_ref.rollout.top_p", "rollout.top_p", SAME),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "resources.gpus_per_engine", SAME),
    ("actor_rollout_ref.rollout.name", "rollout.engine", CONVERTED, "vllm is `rollout.engine: vllm`; sglang has no equivalent."),
    ("actor_rollout_ref.model.path", "model.path", SAME, "fasync loads local directories only, never a hub name."),
    ("actor_rollout_ref.model.lora_rank", "model.lora", CONVERTED, "the adapters' rank; 0 (verl's default) is none."),
    ("actor_rollout_ref.model.lora_alpha", "model.lora", CONVERTED, "model.lora.alpha, with lora_rank."),
    ("actor_rollout_ref.model.target_modules", "model.lora", CONVERTED,
     "model.lora.target_modules; all-linear is null (every linear layer but the head)."),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", "train.global_batch_size", CONVERTED,
     "verl counts prompts and multiplies by rollout.n; fasync counts samples: train.global_batch_size = "
     "ppo_mini_batch_size × rollout.n_samples_per_prompt."),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "train.micro_batch_size", SAME,
     "samples per forward/backward pass on one rank."),
    ("actor_rollout_ref.actor.ppo_micro_batch_size", "train.micro_batch_size", CONVERTED,
     "verl's un-suffixed value is global across GPUs; fasync's is per rank: divide by resources.trainer_ranks."),
    ("actor_rollout_ref.actor.ppo_epochs", "train.ppo_epochs", SAME,
     "passes over each batch, each of ppo_mini_batch_size-prompt optimizer steps, as in fasync."),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "train.importance_ratio", CONVERTED,
     "vanilla is the token ratio, gspo the sequence ratio (train.importance_ratio: sequence); the others have no "
     "equivalent."),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", "train.lr_warmup_steps", CONVERTED,
     "verl steps its scheduler once per training step (rollout), fasync once per optimizer step: × the optimizer "
     "steps per rollout; −1 defers to lr_warmup_steps_ratio."),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", "train.lr_warmup_steps", CONVERTED,
     "a fraction of trainer.total_training_steps, × the optimizer steps per rollout."),
    ("actor_rollout_ref.actor.optim.lr_scheduler_type", "train.lr_schedule", CONVERTED,
     "constant and cosine are the same; verl's cosine decays to min_lr_ratio (default 0), fasync's to 0."),
    ("actor_rollout_ref.actor.optim.warmup_style", "train.lr_schedule", CONVERTED,
     "the older name of lr_scheduler_type: constant and cosine."),
    ("actor_rollout_ref.rollout.top_k", "rollout.top_k", CONVERTED, "−1 (verl's off) is null."),
    ("reward_model.overlong_buffer.enable", "reward.overlong_buffer", CONVERTED,
     "DAPO's overlong shaping (verl's dapo reward manager): on, reward.overlong_buffer is its len."),
    ("reward_model.overlong_buffer.len", "reward.overlong_buffer", CONVERTED, "counts only with enable."),
    ("reward_model.overlong_buffer.penalty_factor", "reward.overlong_penalty", CONVERTED, "counts only with enable."),
    ("actor_rollout_ref.actor.use_kl_loss", "train.kl_coef", CONVERTED,
     "fasync adds the KL to a reference model to the loss whenever train.kl_coef > 0: false is kl_coef 0."),
    ("actor_rollout_ref.actor.kl_loss_coef", "train.kl_coef", CONVERTED, "counts only with use_kl_loss."),
    ("actor_rollout_ref.actor.kl_loss_type", (), NONE,
     "fasync's KL loss is the k3 estimate, verl's low_var_kl without its clamps; kl (k1), abs and mse "
     "(k2) have no equivalent."),
    ("actor_rollout_ref.actor.clip_ratio", ("train.clip_eps_low", "train.clip_eps_high"), SAME),
    ("actor_rollout_ref.actor.clip_ratio_low", "train.clip_eps_low", SAME),
    ("actor_rollout_ref.actor.clip_ratio_high", "train.clip_eps_high", SAME),
    ("actor_rollout_ref.actor.entropy_coeff", "train.entropy_coef", SAME),
    ("actor_rollout_ref.actor.loss_agg_mode", "train.loss_aggregation", CONVERTED,
     "token-mean is token_mean, seq-mean-token-mean is sequence_mean, seq-mean-token-sum-norm (Dr. GRPO) is "
     "seq_mean_token_sum_norm; seq-mean-token-sum has no equivalent."),
    ("actor_rollout_ref.actor.optim.lr", "train.lr", SAME),
    ("actor_rollout_ref.actor.optim.weight_decay", "train.weight_decay", SAME),
    ("actor_rollout_ref.actor.grad_clip", "train.grad_clip", SAME),
    ("actor_rollout_ref.actor.use_dynamic_bsz", (), NONE,
     "it packs micro batches by token count; it is not train.use_dynamic_global_batch_size, which makes each "
     "rollout exactly one optimizer step."),
    ("actor_rollout_ref.actor.use_rollout_log_probs", "correction.ratio_anchor", CONVERTED,
     "the PPO ratio against the rollout's logprobs is `ratio_anchor: behaviour`."),
    ("algorithm.adv_estimator", "train.advantage_estimator", CONVERTED,
     "grpo, rloo, reinforce_plus_plus and reinforce_plus_plus_baseline are the same estimators; gae needs a critic, "
     "and remax, opo, gpg and grpo_passk have no equivalent."),
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
    ("critic.*", (), NONE, NO_CRITIC),
    ("actor_rollout_ref.rollout.multi_turn.*", (), NONE, "other multi-turn settings of verl's tool loop have no "
     "fasync equivalent (docs/agentic.md)."),
    ("actor_rollout_ref.*", (), NONE, NESTED.format(source="verl")),
    ("algorithm.*", (), NONE, NESTED.format(source="verl")),
    ("async_training.*", (), NONE, NESTED.format(source="verl's fully-async recipe")),
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
    ("custom_reward_function.reward_kwargs.*", (), NONE, "fasync passes a reward only the fields it names: give "
     "these parameters defaults in the function."),
    ("reward_model.reward_manager", (), NONE, "naive and dapo score each completion with compute_score "
     "(reward.function); dapo's overlong penalty (reward_kwargs.overlong_buffer_cfg) is the function's to add, "
     "from the completion_tokens it may name."),
    ("reward_model.reward_kwargs.*", (), NONE, "DAPO's overlong buffer penalty: a reward.function that names "
     "completion_tokens (docs/training.md#rewards) subtracts it itself."),
    ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", "rollout.max_turns", SAME),
    ("actor_rollout_ref.rollout.multi_turn.format", "rollout.tool_parser", CONVERTED,
     "hermes (`<tool_call>{json}</tool_call>`) is hermes; other formats have no parser in fasync."),
    ("actor_rollout_ref.rollout.multi_turn.max_tool_response_length", (), NONE,
     "verl cuts a tool's text at this many characters; fasync cuts an observation at "
     "rollout.max_observation_tokens tokens."),
    ("actor_rollout_ref.rollout.multi_turn.enable", "rollout.env", ADAPT,
     "verl's tool-calling loop is fasync's multi-turn loop: a `rollout.env: module:Class` whose `tools` maps each "
     "of verl's tools (tool_config_path) to a function of the call's arguments, and whose `step(model_text)` "
     "gives the reward (docs/agentic.md#environments-and-the-multi-turn-loop)."),
    ("actor_rollout_ref.rollout.multi_turn.tool_config_path", "rollout.env", ADAPT,
     "each BaseTool's `execute(instance_id, parameters)` becomes an entry of the environment's `tools`: "
     "name → function of the call's arguments returning text."),
    ("actor_rollout_ref.rollout.multi_turn.interaction_config_path", "rollout.env", ADAPT,
     "an Interaction's `generate_response(instance_id, messages)` → (done, text, reward) is the environment's "
     "`step(model_text)` → Step(messages, reward, done)."),
    ("actor_rollout_ref.rollout.agent.agent_loop_config_path", "rollout.function", ADAPT,
     "an AgentLoopBase's `run(sampling_params, **kwargs)` → AgentLoopOutput (prompt_ids, response_ids, "
     "response_mask) is a `rollout.function`: `async def f(task, engine)` that builds the Trajectory with "
     "`engine.generate` (docs/agentic.md#custom-rollout-functions)."),
    ("actor_rollout_ref.rollout.agent.*", (), NONE, "agent-loop workers: fasync runs every trajectory as an "
     "asyncio task."),
    ("actor_rollout_ref.rollout.mode", (), NONE, "verl's async server mode, which its multi-turn loop needs; "
     "fasync's engines serve both."),
]


LORA_KEYS = ("actor_rollout_ref.model.lora_rank", "actor_rollout_ref.model.lora_alpha",
             "actor_rollout_ref.model.target_modules")
ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
"""verl's advantage estimators that are fasync's, under the same names."""
CHOICES = [
    Choice("algorithm.adv_estimator", {name: {"train.advantage_estimator": name} for name in ESTIMATORS}),
    Choice("actor_rollout_ref.actor.loss_agg_mode", {
        "token-mean": {"train.loss_aggregation": "token_mean"},
        "seq-mean-token-mean": {"train.loss_aggregation": "sequence_mean"},
        "seq-mean-token-sum-norm": {"train.loss_aggregation": "seq_mean_token_sum_norm"}}),
    Choice("actor_rollout_ref.actor.policy_loss.loss_mode", {"vanilla": {"train.importance_ratio": "token"},
                                                              "gspo": {"train.importance_ratio": "sequence"}}),
    Choice("actor_rollout_ref.actor.optim.lr_scheduler_type", {name: {"train.lr_schedule": name}
                                                               for name in ("constant", "cosine")}),
    Choice("actor_rollout_ref.actor.optim.warmup_style", {name: {"train.lr_schedule": name}
                                                          for name in ("constant", "cosine")}),
]
"""verl's keys whose values name an algorithm."""


def import_into(source: Source, out: Imported) -> set[str]:
    """The mode from the entry point (`...fully_async_main`, `...one_step_off_policy.main_ppo`), else from
    `async_training.*`; verl's own defaults where they differ from fasync's."""
    fully_async, one_step_off = _mode(source, out)
    _defaults(source, out, fully_async)
    converted = import_choices(CHOICES, source, out) | _import_algorithm(source, out, fully_async) | import_lora(
        source, out, *LORA_KEYS)
    _resources(source, out, separate=fully_async or one_step_off)
    _correction(source, out)
    _geometry(source, out, fully_async)
    _ceil_staleness(source, "async_training.staleness_threshold", out)
    if source.get("actor_rollout_ref.actor.use_kl_loss"):
        coef = source.get("actor_rollout_ref.actor.kl_loss_coef", 0.001)
        out.set("train.kl_coef", coef, f"use_kl_loss with {source.cite('actor_rollout_ref.actor.kl_loss_coef', 0.001)}")
    _reward(source, out)
    _data(source, out)
    _micro_batch(source, out)
    if source.get("actor_rollout_ref.rollout.multi_turn.format", "hermes") == "hermes" and any(
            k.startswith("actor_rollout_ref.rollout.multi_turn.") for k in source.values):
        out.set("rollout.tool_parser", "hermes", source.cite("actor_rollout_ref.rollout.multi_turn.format", "hermes"))
    _trackers(source, out)
    return converted | {
        "actor_rollout_ref.actor.ppo_mini_batch_size", "async_training.require_batches", "actor_rollout_ref.rollout.name",
        "trainer.n_gpus_per_node", "trainer.nnodes", "rollout.n_gpus_per_node", "rollout.nnodes",
        "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.actor.use_rollout_log_probs",
        *(k for k in source.values if ".rollout_correction." in k), "async_training.staleness_threshold",
        "rollout.total_rollout_steps", "async_training.use_rollout_log_probs", "async_training.compute_prox_log_prob",
        "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_coef", "trainer.logger",
        "custom_reward_function.path", "custom_reward_function.name", "actor_rollout_ref.rollout.multi_turn.format",
        "data.train_files", "data.filter_overlong_prompts", "actor_rollout_ref.actor.ppo_micro_batch_size"}


def _mode(source: Source, out: Imported) -> tuple[bool, bool]:
    """`mode` (and one-step-off's bound) from the entry point, else from `async_training.*`; returns (fully
    async, one step off)."""
    fully_async = "fully_async" in source.script or any(k.startswith("async_training.") for k in source.values)
    one_step_off = "one_step_off" in source.script
    if one_step_off:
        out.set("mode", "async", f"{source.script}: the next batch is generated by the previous weights")
        out.set("async.max_weight_staleness", 1, f"{source.script}: one step off")
    elif fully_async:
        out.set("mode", "fully_async", f"{source.script or 'async_training.*'}: verl's fully-async recipe")
    else:
        out.set("mode", "sync", f"{source.script or 'verl.trainer.main_ppo'}: verl's PPO trainer is synchronous")
    return fully_async, one_step_off


def _geometry(source: Source, out: Imported, fully_async: bool) -> None:
    """The optimizer step (ppo_mini_batch_size prompt groups), the fully-async recipe's drain (require_batches
    steps) and run length, and where the PPO ratio is anchored."""
    n = source.get("actor_rollout_ref.rollout.n", 1)
    mini = source.get("actor_rollout_ref.actor.ppo_mini_batch_size")
    if mini is not None:
        out.set("train.global_batch_size", mini * n, f"{source.cite('actor_rollout_ref.actor.ppo_mini_batch_size')} "
                f"prompts × {source.cite('actor_rollout_ref.rollout.n', 1)} = {mini * n} samples")
    if fully_async and mini is not None:
        batches = source.get("async_training.require_batches", 1)
        out.set("rollout.batch_size", batches * mini,
                f"{source.cite('async_training.require_batches', 1)} × ppo_mini_batch_size {mini} = {batches * mini} "
                f"prompts per drain, {batches} optimizer step{'s' * (batches != 1)}")
        total = source.get("rollout.total_rollout_steps")
        if total is not None:
            out.set("train.num_rollouts", max(total // (batches * mini), 1),
                    f"{source.cite('rollout.total_rollout_steps')} prompts / {batches * mini} per drain")
        out.set("correction.ratio_anchor", *_ratio_anchor(source))
    elif not source.get("actor_rollout_ref.actor.use_rollout_log_probs"):
        out.set("correction.ratio_anchor", "recompute",
                f"{source.cite('actor_rollout_ref.actor.use_rollout_log_probs', False)}: the old logprobs are recomputed")
    else:
        out.set("correction.ratio_anchor", "behaviour",
                f"{source.cite('actor_rollout_ref.actor.use_rollout_log_probs')}: the rollout's logprobs")


def _micro_batch(source: Source, out: Imported) -> None:
    """ppo_micro_batch_size is global in verl (its `_per_gpu` twin is not): fasync's is per trainer rank."""
    micro = source.get("actor_rollout_ref.actor.ppo_micro_batch_size")
    ranks = out.values["resources.trainer_ranks"][0]
    if isinstance(micro, int) and "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" not in source.values:
        out.set("train.micro_batch_size", max(micro // ranks, 1),
                f"{source.cite('actor_rollout_ref.actor.ppo_micro_batch_size')} across {ranks} trainer ranks")


def _trackers(source: Source, out: Imported) -> None:
    """trainer.logger: one name, a list, or hydra's string of a list; the ones fasync has."""
    if "trainer.logger" in source.values:
        loggers = source.get("trainer.logger")
        loggers = yaml.safe_load(loggers) if isinstance(loggers, str) else loggers
        out.set_trackers({name: source.cite("trainer.logger")
                          for name in ([loggers] if isinstance(loggers, str) else loggers or []) if name in TRACKERS})


def _data(source: Source, out: Imported) -> None:
    """data.train_files (one parquet file, as fasync reads it; hydra may write it as a one-element list) and
    filter_overlong_prompts with data.max_prompt_length as its limit."""
    files = source.get("data.train_files")
    if isinstance(files, str) and files.startswith("["):
        files = yaml.safe_load(files)
    if isinstance(files, list) and len(files) == 1:
        files = files[0]
    if isinstance(files, str) and files:
        out.set("data.path", files, source.cite("data.train_files"))
    elif files:
        out.need("data.path", f"{source.cite('data.train_files')}: fasync reads one file; join them into one")
    if "data.filter_overlong_prompts" in source.values:
        keep = "filter" if source.get("data.filter_overlong_prompts") else "fail"
        out.set("data.overlong_prompts", keep, source.cite("data.filter_overlong_prompts"))
        if keep == "filter" and isinstance(source.get("data.max_prompt_length"), int):
            out.set("data.max_prompt_tokens", source.get("data.max_prompt_length"), source.cite("data.max_prompt_length"))


DEFAULT_SCORE = "verl.utils.reward_score.default_compute_score"
"""What verl scores with when no custom_reward_function.path is set: a scorer chosen by each record's data_source."""


def _reward(source: Source, out: Imported) -> None:
    """custom_reward_function.path and .name as `module:function`, looked for beside the fasync config; its
    compute_score(data_source, solution_str, ground_truth, extra_info) signature is one fasync calls as it is.
    Without one, verl's default scorer is chosen per record, which the config cannot say: the import asks."""
    path, name = source.get("custom_reward_function.path"), source.get("custom_reward_function.name", "compute_score")
    if source.get("reward_model.enable"):
        raise ImportFailure(f"not supported: a learned reward model ({source.cite('reward_model.enable')}); fasync "
                            "rewards are functions of the completion and the label")
    if path in (None, "", "null"):
        out.need("reward.function", f"verl scores with {DEFAULT_SCORE}, a scorer per record's data_source, as no "
                 "custom_reward_function.path is set: for math data (GSM8K's ####, \\boxed{}, DAPO's Answer:) "
                 "fasync's math_verify is nearest; or a module whose compute_score(data_source, solution_str, "
                 "ground_truth, extra_info) scores yours")
        return
    spec = module_function(str(path), str(name))
    file = str(path).rsplit("/", 1)[-1]
    if spec is None:
        out.need("reward.function", f"{source.cite('custom_reward_function.path')} is no importable module name: "
                 f"rename it, then set reward.function: module:{name}")
        return
    out.set("reward.function", spec, f"{source.cite('custom_reward_function.path')}, "
            f"{source.cite('custom_reward_function.name', 'compute_score')}: put {file} beside this config or on "
            "PYTHONPATH; verl's compute_score signature is called as it is")




def _defaults(source: Source, out: Imported, fully_async: bool) -> None:
    """verl's values where fasync's defaults differ (actor.yaml, rollout.yaml, ppo_trainer.yaml); the values a
    source sets are `CHOICES`'."""
    estimator = source.get("algorithm.adv_estimator", "gae")
    if estimator not in ESTIMATORS:
        cited = source.cite("algorithm.adv_estimator", "gae")
        raise ImportFailure(f"{cited} is not supported: " + (
            "PPO with a critic (gae); fasync has no value model" if estimator == "gae" else
            f"fasync's advantages are {', '.join(ESTIMATORS)} and reinforce_baseline"))
    if "actor_rollout_ref.actor.loss_agg_mode" not in source.values:
        out.set("train.loss_aggregation", "token_mean", source.cite("actor_rollout_ref.actor.loss_agg_mode", "token-mean"))
    name = source.get("actor_rollout_ref.rollout.name", "vllm")
    if name == "vllm":
        out.set("rollout.engine", "vllm", source.cite("actor_rollout_ref.rollout.name", "vllm"))


def _resources(source: Source, out: Imported, separate: bool) -> None:
    """Trainer GPUs from trainer.*, rollout GPUs from rollout.* (the asynchronous recipes), else shared."""
    nodes, per_node = source.get("trainer.nnodes", 1), source.get("trainer.n_gpus_per_node", 8)
    tp = source.get("actor_rollout_ref.rollout.tensor_model_parallel_size", 2)
    trainer = nodes * per_node
    rollout = source.get("rollout.nnodes", 1) * source.get("rollout.n_gpus_per_node", 0) if separate else trainer
    why = f"{source.cite('trainer.nnodes', 1)} × {source.cite('trainer.n_gpus_per_node', 8)}"
    out.set("resources.trainer_ranks", trainer, f"{why} trainer GPUs")
    out.set("resources.gpus_per_trainer_rank", 1, "one GPU per trainer rank")
    out.set("resources.gpus_per_engine", tp, source.cite("actor_rollout_ref.rollout.tensor_model_parallel_size", 2))
    out.set("resources.num_rollout_engines", max(rollout // tp, 1), f"{rollout} rollout GPUs / {tp} per engine")
    out.set("resources.colocate", not separate, "the rollout has its own GPUs (rollout.*)" if separate else
            "verl's hybrid engine shares the trainer's GPUs")
    out.set("resources.num_gpus", trainer + rollout if separate else trainer,
            f"{trainer} trainer + {rollout} rollout GPUs" if separate else f"{trainer} GPUs, shared")
    out.set("resources.gpus_per_node", max(per_node, 8), f"{source.cite('trainer.n_gpus_per_node', 8)}; nodes of "
            "at least 8 GPUs (the trainer's and the rollout's pools may share one)")


def _correction(source: Source, out: Imported) -> None:
    """algorithm.rollout_correction.*: importance weights and rejection."""
    prefix = "algorithm.rollout_correction."
    level = source.get(prefix + "rollout_is")
    if level in ("token", "sequence"):
        out.set("correction.level", level, source.cite(prefix + "rollout_is"))
        threshold = source.get(prefix + "rollout_is_threshold")
        if isinstance(threshold, (int, float)):
            out.set("correction.weight_upper", float(threshold), source.cite(prefix + "rollout_is_threshold"))
    mode, bound = source.get(prefix + "rollout_rs"), source.get(prefix + "rollout_rs_threshold")
    if isinstance(mode, str) and bound is not None:
        low, _, high = str(bound).partition("_")
        interval = [float(low), float(high)] if high else [0.0, float(low)]
        key = "correction.reject_sequence_ratio" if mode.startswith("seq") else "correction.reject_token_ratio"
        out.set(key, interval, f"{source.cite(prefix + 'rollout_rs')}, {source.cite(prefix + 'rollout_rs_threshold')}")


def _optimizer_steps_per_rollout(source: Source, fully_async: bool) -> int:
    """verl's optimizer steps per training step: train_batch_size / ppo_mini_batch_size prompts (the fully-async
    recipe: require_batches), each ppo_epochs times."""
    mini = source.get("actor_rollout_ref.actor.ppo_mini_batch_size", 256)
    if fully_async:
        steps = source.get("async_training.require_batches", 1)
    else:
        steps = max(source.get("data.train_batch_size", 1024) // mini, 1)
    return steps * source.get("actor_rollout_ref.actor.ppo_epochs", 1)


def _import_algorithm(source: Source, out: Imported, fully_async: bool) -> set[str]:
    """top_k, the warmup in optimizer steps and the overlong buffer; returns the keys converted."""
    converted = set()
    top_k = "actor_rollout_ref.rollout.top_k"
    if top_k in source.values:
        value = source.get(top_k)
        out.set("rollout.top_k", value if value > 0 else None, source.cite(top_k))
        converted.add(top_k)
    steps = _optimizer_steps_per_rollout(source, fully_async)
    warmup, ratio = "actor_rollout_ref.actor.optim.lr_warmup_steps", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio"
    if source.get(warmup, -1) >= 0:
        out.set("train.lr_warmup_steps", source.get(warmup) * steps,
                f"{source.cite(warmup)} training steps × {steps} optimizer steps each")
        converted |= {warmup, ratio}
    elif source.get(ratio, 0) > 0 and "trainer.total_training_steps" in source.values:
        rollouts = int(source.get(ratio) * source.get("trainer.total_training_steps"))
        out.set("train.lr_warmup_steps", rollouts * steps, f"{source.cite(ratio)} × "
                f"{source.cite('trainer.total_training_steps')} = {rollouts} training steps × {steps} optimizer steps")
        converted |= {warmup, ratio}
    overlong = "reward_model.overlong_buffer"
    if source.get(f"{overlong}.enable"):
        out.set("reward.overlong_buffer", source.get(f"{overlong}.len"), source.cite(f"{overlong}.len"))
        out.set("reward.overlong_penalty", source.get(f"{overlong}.penalty_factor", 1.0),
                source.cite(f"{overlong}.penalty_factor", 1.0))
    if f"{overlong}.enable" in source.values:
        converted |= {f"{overlong}.{name}" for name in ("enable", "len", "penalty_factor")}
    return converted


def _express_algorithm(cfg, derived, out: Expressed) -> None:
    for choice in CHOICES[:-1]:  # the last, warmup_style, is lr_scheduler_type's older name: read, never written
        choice.express(cfg, out, choice.key)
    train = cfg.train
    if not train.normalize_advantage_std:
        out.put("algorithm.norm_adv_by_std_in_grpo", False, "train.normalize_advantage_std")
    if train.ppo_epochs != 1:
        out.put("actor_rollout_ref.actor.ppo_epochs", train.ppo_epochs, "train.ppo_epochs")
    if train.lr_warmup_steps:
        steps = derived.optimizer_steps_per_rollout
        if train.lr_warmup_steps % steps:
            out.missing.append(f"train.lr_warmup_steps {train.lr_warmup_steps}: verl warms up by training steps "
                               f"of {steps} optimizer steps each")
        out.put("actor_rollout_ref.actor.optim.lr_warmup_steps", -(-train.lr_warmup_steps // steps),
                f"train.lr_warmup_steps {train.lr_warmup_steps} / {steps} optimizer steps per training step")
    if cfg.rollout.top_k is not None:
        out.put("actor_rollout_ref.rollout.top_k", cfg.rollout.top_k, "rollout.top_k")
    if cfg.reward.overlong_buffer is not None:
        out.put("reward_model.reward_manager", "dapo", "verl applies the overlong buffer in its dapo reward manager")
        out.put("reward_model.overlong_buffer.enable", True, "reward.overlong_buffer")
        out.put("reward_model.overlong_buffer.len", cfg.reward.overlong_buffer, "reward.overlong_buffer")
        out.put("reward_model.overlong_buffer.penalty_factor", cfg.reward.overlong_penalty, "reward.overlong_penalty")
    express_lora(cfg, out, *LORA_KEYS)
    out.note_algorithm(cfg, ALGORITHM_SETTINGS)


def _ratio_anchor(source: Source) -> tuple[str, str]:
    if source.get("async_training.compute_prox_log_prob"):
        return "proximal", f"{source.cite('async_training.compute_prox_log_prob')}: decoupled PPO"
    if source.get("async_training.use_rollout_log_probs", True):
        return "behaviour", f"{source.cite('async_training.use_rollout_log_probs', True)}: the rollout's logprobs"
    return "recompute", f"{source.cite('async_training.use_rollout_log_probs')}: recomputed logprobs"


def _ceil_staleness(source: Source, key: str, out: Imported) -> None:
    if key in source.values:
        threshold = float(source.get(key))
        out.set("async.max_weight_staleness", math.ceil(threshold),
                f"ceil({source.cite(key)}) = {math.ceil(threshold)}: verl's threshold is a fraction of extra samples "
                "per sync, trained up to one sync later")


def express(cfg, derived) -> Expressed:
    prompts, n, per_step, steps, bound, interval = geometry(cfg, derived)
    fully_async = cfg.mode != "sync"
    out = Expressed(FRAMEWORK, "python3 -m verl.experimental.fully_async_policy.fully_async_main" if fully_async
                    else "python3 -m verl.trainer.main_ppo")
    mini = out.prompts_per_step(per_step, n)
    out.put("actor_rollout_ref.rollout.n", n, "rollout.n_samples_per_prompt")
    out.put("actor_rollout_ref.actor.ppo_mini_batch_size", mini, f"{per_step} samples per step / {n}")
    out.note_trimmed_samples(derived)
    _express_algorithm(cfg, derived, out)
    if not fully_async:
        out.put("data.train_batch_size", prompts, "rollout.batch_size")
        out.put("trainer.total_training_steps", cfg.train.num_rollouts, "train.num_rollouts")
        return out
    if cfg.mode == "async":
        out.missing.append("mode async: verl's asynchronous recipe is the fully-async one (mode: fully_async)")
    if bound is None:
        out.missing.append("no staleness bound: verl's staleness_threshold is always a number")
    out.put("data.train_batch_size", 0, "the fully-async recipe fetches require_batches mini-batches instead")
    out.put("async_training.require_batches", steps, f"{steps} optimizer steps per drain of {prompts} prompts")
    out.put("async_training.staleness_threshold", float(bound or 0), f"async.max_weight_staleness {bound}")
    out.put("async_training.trigger_parameter_sync_step", interval, "async.update_weights_interval")
    out.put("async_training.partial_rollout", cfg.async_.partial_rollout, "async.partial_rollout")
    out.put("rollout.total_rollout_steps", cfg.train.num_rollouts * prompts,
            f"{cfg.train.num_rollouts} drains × {prompts} prompts")
    return out


FRAMEWORK = Framework("verl", "verl", ROWS, import_into, express, rollout_checkpoint_keys=("trainer.save_freq",),
                      data_keys=("data.train_files",), reward_keys=("custom_reward_function.path", "reward_model.reward_manager"),
                      modes=("`verl.trainer.main_ppo` is `sync`. `recipe.one_step_off_policy.main_ppo` (or any "
                             "`one_step_off` entry point) is `async` with `async.max_weight_staleness: 1`: the next "
                             "batch is generated by the previous weights. `...fully_async_policy.fully_async_main` "
                             "(the recipe or `verl.experimental`), or any `async_training.*` key, is `fully_async`."),
                      defaults=("`algorithm.adv_estimator` defaults to gae, PPO with a critic, which fasync refuses as "
                                "not supported; `loss_agg_mode` token-mean; `rollout.name` vllm; "
                                "`tensor_model_parallel_size` 2; `trainer.nnodes` 1 × `n_gpus_per_node` 8, shared by "
                                "the hybrid engine (`resources.colocate`) and separate in the asynchronous recipes "
                                "(`rollout.nnodes` × `rollout.n_gpus_per_node`); `use_rollout_log_probs` false "
                                "(`correction.ratio_anchor: recompute`) outside the fully-async recipe, whose default "
                                "is true (`behaviour`); `save_freq` -1 is `checkpoint.every: 0` (never)."),
                      rewards=("`custom_reward_function.path` (a file) and `.name` (default compute_score) are "
                               "`reward.function: module:function`, the module looked for beside the fasync config "
                               "(or on PYTHONPATH): verl's `compute_score(data_source, solution_str, ground_truth, "
                               "extra_info)` is called as it is. Without one, verl picks a scorer by each record's "
                               "`data_source`, which a config cannot say: the import exits 1 asking for "
                               "`reward.function` (`math_verify` for math data). `reward_model.enable` (a learned "
                               "reward model) is refused as not supported; the DAPO reward manager's overlong penalty "
                               "is listed for the function to add. Multi-turn tool calling "
                               "(`multi_turn.enable`, `tool_config_path`, `interaction_config_path`) asks for a "
                               "`rollout.env` and an agent loop (`agent.agent_loop_config_path`) for a "
                               "`rollout.function`, each note saying how to port it; `max_assistant_turns` is "
                               "`rollout.max_turns` and the hermes format `rollout.tool_parser: hermes`."),
                      hydra=True)
