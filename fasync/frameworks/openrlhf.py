"""OpenRLHF (OpenRLHF/OpenRLHF): synchronous, async (whole rollouts) or partial rollout; argparse flags."""

from __future__ import annotations

from fasync.frameworks.common import (
    ADAPT,
    CONVERTED,
    NO_CRITIC,
    NONE,
    SAME,
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

REMOTE_REWARD = ("an http(s) URL is reward.url (OpenRLHF posts {query, prompts, labels} lists, fasync {\"items\": "
                 "[...]}: the server needs fasync's route, docs/training.md#a-remote-reward); a .py file's "
                 "`reward_func(queries, prompts, labels)` scores prompt+completion texts in a batch: the import asks "
                 "for a reward.function, batched, of `prompt`, `completion` and `label` lists.")

LEARNED_REWARD = ("a learned reward model, which OpenRLHF runs on its own GPUs when no remote_rm_url is set: fasync "
                  "scores through a server that runs it, answering fasync's batches ({\"items\": [...]} → "
                  "{\"rewards\": [...]}, docs/training.md#a-remote-reward): the import asks for its reward.url.")
KL_ESTIMATOR = "fasync's KL loss is always the k3 estimate: k3 carries over, k1 and k2 have no equivalent."
REWARD_MODEL_GPUS = "the learned reward model's GPUs: the reward server's, outside fasync's resources."

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
    ("entropy_loss_coef", "train.entropy_coef", SAME),
    ("dynamic_filtering", "rollout.dynamic_sampling", CONVERTED, "drops groups whose rewards are all equal."),
    ("eps_clip_low_high", ("train.clip_eps_low", "train.clip_eps_high"), CONVERTED, "two values: low, high."),
    ("actor.model_name_or_path", "model.path", SAME, "fasync loads local directories only, never a hub name."),
    ("pretrain", "model.path", SAME, "fasync loads local directories only, never a hub name."),
    ("prompt_data", "data.path", SAME, "a JSONL file of prompt/label objects in fasync (a hub dataset name is not)."),
    ("input_key", "data.prompt_key", SAME),
    ("label_key", "data.label_key", SAME),
    ("lora_rank", "model.lora", CONVERTED, "the adapters' rank; 0 (OpenRLHF's default) is none."),
    ("lora_alpha", "model.lora", CONVERTED, "model.lora.alpha, with lora_rank."),
    ("target_modules", "model.lora", CONVERTED, "model.lora.target_modules; all-linear is null."),
    ("lora_dropout", (), NONE, "fasync's adapters have no dropout: the trainer runs the policy in eval mode."),
    ("remote_rm_url", ("reward.url", "reward.function"), CONVERTED,
     REMOTE_REWARD),
    ("reward.remote_url", ("reward.url", "reward.function"), CONVERTED,
     REMOTE_REWARD),
    ("reward_pretrain", "reward.url", ADAPT, LEARNED_REWARD),
    ("reward_num_nodes", (), NONE, REWARD_MODEL_GPUS),
    ("reward_num_gpus_per_node", (), NONE, REWARD_MODEL_GPUS),
    ("kl_estimator", (), NONE, KL_ESTIMATOR),
    ("use_kl_estimator_k3", (), NONE, KL_ESTIMATOR),
    ("agent_func_path", "rollout.env", ADAPT,
     "its AgentInstance is a fasync environment: `reset(states)` → observation becomes `reset(task)` → messages, "
     "`step(states)` → rewards, environment_feedback, done becomes `step(model_text)` → Step(messages, reward, "
     "done); the steps' rewards are the trajectory's (docs/agentic.md#environments-and-the-multi-turn-loop)."),
]


def import_into(source: Source, out: Imported) -> set[str]:
    """train_ppo_ray.py's defaults (advantage_estimator gae, a critic: refused; n_samples_per_prompt 1,
    eps_clip 0.2); vLLM engines always; --async_train gives vLLM its own GPUs even with --colocate_all_models."""
    _refuse_unsupported(source)
    converted = import_choices(CHOICES, source, out) | import_lora(source, out, *LORA_KEYS)
    partial = source.get("train.partial_rollout_enable") or source.get("partial_rollout_enable")
    asynchronous = source.get("train.async_enable") or source.get("async_train")
    if partial:
        out.set("mode", "fully_async", "partial rollout: fasync resumes generations across a sync only in fully_async")
        out.set("async.partial_rollout", True, "train.partial_rollout_enable")
    else:
        out.set("mode", "async" if asynchronous else "sync",
                f"{source.cite('async_train')}: whole rollouts overlap training" if asynchronous
                else "OpenRLHF trains synchronously")
    if asynchronous or partial:
        queue_key = "train.async_queue_size" if "train.async_queue_size" in source.values else "async_queue_size"
        if queue_key in source.values:
            queue, why = source.get(queue_key), source.cite(queue_key)
        elif "OPENRLHF_ASYNC_QUEUE_SIZE" in source.variables:
            queue = int(source.variables["OPENRLHF_ASYNC_QUEUE_SIZE"])
            why = f"OPENRLHF_ASYNC_QUEUE_SIZE={queue} (the script's environment)"
        else:
            queue, why = 1, "async_queue_size 1 (the OpenRLHF default)"
        out.set("async.max_weight_staleness", queue, f"{why}: rollouts queued ahead of the trainer")
    out.set("rollout.n_samples_per_prompt", source.get("n_samples_per_prompt", source.get(
        "rollout.n_samples_per_prompt", 1)), source.cite("n_samples_per_prompt", 1))
    _clip(source, out)
    if source.get("use_kl_loss") and "init_kl_coef" in source.values:
        out.set("train.kl_coef", source.get("init_kl_coef"), f"{source.cite('use_kl_loss')} with "
                f"{source.cite('init_kl_coef')}")
    if source.get("dynamic_filtering"):
        out.set("rollout.dynamic_sampling", True, source.cite("dynamic_filtering"))
    _correction(source, out, bool(asynchronous or partial))
    _resources(source, out, colocate=bool(source.get("colocate_all_models") or source.get("train.colocate_all"))
               and not (asynchronous or partial))
    trackers = {}
    if source.get("use_wandb"):
        trackers["wandb"] = source.cite("use_wandb")
    if source.get("use_tensorboard"):
        trackers["tensorboard"] = source.cite("use_tensorboard")
    out.set_trackers(trackers)
    _reward(source, out)
    if source.get("reward_pretrain") and not _learned_reward_model(source):
        converted.add("reward_pretrain")
        out.unmapped.append((source.written.get("reward_pretrain", "reward_pretrain"), source.get("reward_pretrain"),
                             "ignored: OpenRLHF builds no reward model when a remote reward or an agent is set"))
    return converted | {
        "train.partial_rollout_enable", "partial_rollout_enable", "train.async_enable", "async_train",
        "train.async_queue_size", "async_queue_size", "use_wandb", "use_tensorboard", "n_samples_per_prompt",
        "eps_clip_low_high", "actor.eps_clip_low_high", "use_kl_loss", "init_kl_coef", "dynamic_filtering",
        "enable_vllm_is_correction", "vllm_enable_is_correction", "vllm_is_truncated_threshold",
        "vllm_is_correction_type", "use_icepop", "actor_num_nodes", "actor_num_gpus_per_node", "vllm_num_engines",
        "vllm_tensor_parallel_size", "colocate_all_models", "remote_rm_url", "reward.remote_url", "actor.num_nodes",
        "actor.num_gpus_per_node", "algo.advantage.is_correction_enable", "algo.advantage.is_correction_threshold"}


def _learned_reward_model(source: Source) -> bool:
    """train_ppo_ray.py scores with the `--reward_pretrain` model only when no `--remote_rm_url` (or agent,
    whose steps give the reward) is set: it builds the RewardModelActor group only then."""
    return bool(source.get("reward_pretrain")) and not any(
        source.get(key) for key in ("remote_rm_url", "reward.remote_url", "agent_func_path"))


def _refuse_unsupported(source: Source) -> None:
    """A critic is refused; a learned reward model alone is not: its `adapt it` row asks for the server that runs
    it."""
    estimator = source.get("advantage_estimator", source.get("algo.advantage.estimator", "gae"))
    reasons = []
    if estimator == "gae" or any(key.startswith("critic_num") for key in source.values):
        reasons.append(f"PPO with a critic ({source.cite('advantage_estimator', 'gae')}); fasync has no value model")
    elif estimator not in ADVANTAGE_ESTIMATOR:
        reasons.append(f"{source.cite('advantage_estimator')} advantages")
    if reasons and _learned_reward_model(source):
        reasons.append(f"a learned reward model ({source.cite('reward_pretrain')})")
    if reasons:
        raise ImportFailure("not supported: " + "; ".join(reasons))


def _reward(source: Source, out: Imported) -> None:
    """--remote_rm_url: a reward server (reward.url) or a Python file of `reward_func(queries, prompts, labels)`,
    a batch function of other fields than fasync's: the import asks for its adaptation."""
    key = next((k for k in ("remote_rm_url", "reward.remote_url") if k in source.values), None)
    if key is None:  # a learned reward model alone is its `adapt it` row's: the import asks for its server
        return
    value = source.get(key)
    references = [str(v) for v in value] if isinstance(value, list) else str(value).split(",")
    reference = references[0]
    if len(references) > 1:
        out.need("reward.url", f"{source.cite(key)}: OpenRLHF spreads requests over {len(references)} servers; "
                 "fasync posts to one reward.url (a load balancer in front of them)")
        return
    if reference.startswith(("http://", "https://")):
        out.set("reward.url", reference, f"{source.cite(key)}: the server must answer fasync's batches "
                "({\"items\": [...]} → {\"rewards\": [...]}), not OpenRLHF's {query, prompts, labels}")
        return
    spec = module_function(reference, "reward_func") or "module:function"
    out.need("reward.function", f"{source.cite(key)}: OpenRLHF calls reward_func(queries, prompts, labels) on a batch of "
             f"prompt+completion texts; fasync: {spec} taking lists of `prompt`, `completion` and `label` (the "
             "fields it names) with reward.batched: true, returning a list of floats")


def _clip(source: Source, out: Imported) -> None:
    pair_key = next((k for k in ("eps_clip_low_high", "actor.eps_clip_low_high") if k in source.values), None)
    pair = source.get(pair_key) if pair_key else None
    if isinstance(pair, list) and len(pair) == 2:
        out.set("train.clip_eps_low", float(pair[0]), f"{source.cite(pair_key)}: the first value")
        out.set("train.clip_eps_high", float(pair[1]), f"{source.cite(pair_key)}: the second value")


def _correction(source: Source, out: Imported, asynchronous: bool) -> None:
    """vLLM importance-sampling correction: `--enable_vllm_is_correction` with the truncation interval
    `--vllm_is_truncated_threshold` (default 0.5 5.0), and ICEPOP (`--use_icepop`, `--vllm_is_correction_type
    icepop`), which zeroes the weights outside it; the older `--vllm_enable_is_correction` had one cap, 2."""
    nested = source.get("algo.advantage.is_correction_enable")  # the nested layout's spelling of the newer flag
    newer = source.get("enable_vllm_is_correction") or nested
    if newer or source.get("vllm_enable_is_correction") or source.get("use_icepop"):
        key = "algo.advantage.is_correction_enable" if nested else \
            "enable_vllm_is_correction" if newer else "vllm_enable_is_correction"
        out.set("correction.level", "token", source.cite(key if key in source.values else "use_icepop"))
        threshold_key = "algo.advantage.is_correction_threshold" if nested else "vllm_is_truncated_threshold"
        threshold = source.get(threshold_key, [0.5, 5.0] if newer or source.get("use_icepop") else 2.0)
        bounds = [float(v) for v in threshold] if isinstance(threshold, list) else [0.0, float(threshold)]
        why = source.cite(threshold_key, threshold)
        if newer and threshold_key not in source.values:
            why += "; OpenRLHF v0.8.9 to v0.9.0 capped this flag at 2 (set correction.weight_upper: 2.0 for those)"
        out.set("correction.weight_upper", bounds[-1], why)
        if source.get("use_icepop") or source.get("vllm_is_correction_type") == "icepop":
            out.set("correction.reject_token_ratio", bounds if len(bounds) == 2 else [0.0, bounds[-1]],
                    "ICEPOP: tokens whose weight leaves the interval are dropped")
    elif asynchronous:
        out.set("correction.ratio_anchor", "recompute", "OpenRLHF recomputes the old logprobs with the actor")


def _resources(source: Source, out: Imported, colocate: bool) -> None:
    nodes = source.get("actor_num_nodes", source.get("actor.num_nodes", 1))
    per_node = source.get("actor_num_gpus_per_node", source.get("actor.num_gpus_per_node", 8))
    engines = source.get("vllm_num_engines", source.get("vllm.num_engines"))
    tp = source.get("vllm_tensor_parallel_size", source.get("vllm.tensor_parallel_size", 1))
    trainer = nodes * per_node
    out.set("resources.trainer_ranks", trainer, f"{source.cite('actor_num_nodes', 1)} × "
            f"{source.cite('actor_num_gpus_per_node', 8)}")
    out.set("resources.gpus_per_trainer_rank", 1, "one GPU per actor rank")
    out.set("resources.colocate", colocate, f"{source.cite('colocate_all_models', False)}" +
            ("" if colocate or not source.get("colocate_all_models") else
             ": with --async_train OpenRLHF gives vLLM its own GPUs"))
    rollout = 0
    if engines:
        rollout = engines * tp
        out.set("rollout.engine", "vllm", "OpenRLHF generates with vLLM")
        out.set("resources.num_rollout_engines", engines, source.cite("vllm_num_engines"))
        out.set("resources.gpus_per_engine", tp, source.cite("vllm_tensor_parallel_size", 1))
    out.set("resources.num_gpus", trainer if colocate else trainer + rollout,
            f"{trainer} actor GPUs" + ("" if colocate else f" + {rollout} vLLM GPUs"))
    out.set("resources.gpus_per_node", max(per_node, 8), "nodes of at least 8 GPUs")


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
                      rollout_checkpoint_keys=("ckpt.save_steps", "save_steps"),
                      data_keys=("prompt_data", "data.prompt_data"),
                      reward_keys=("remote_rm_url", "agent_func_path", "reward.remote_url"),
                      rewards=("`--remote_rm_url` (or `reward.remote_url`) naming a server is `reward.url` (fasync "
                               "posts batches of its own shape: the server needs that route); naming a Python file, "
                               "its `reward_func(queries, prompts, labels)` asks for a batched `reward.function` of "
                               "`prompt`, `completion` and `label` lists. `--agent_func_path` asks for a "
                               "`rollout.env`: its AgentInstance's `reset`/`step` map onto an environment's, whose "
                               "steps give the reward. A learned reward model (`--reward_pretrain`, which OpenRLHF "
                               "runs when no `--remote_rm_url` is set) asks for a `reward.url`: fasync scores "
                               "through a server that runs the model; with a critic it is refused."),
                      modes=("`--async_train` (`train.async_enable`) is `async`, its bound `--async_queue_size` (or "
                             "`OPENRLHF_ASYNC_QUEUE_SIZE`, exported by the script or given with `--env`; default 1); "
                             "partial rollout is `fully_async` with `async.partial_rollout`; otherwise `sync`."),
                      defaults=("`advantage_estimator` defaults to gae (a critic): refused as not supported; "
                                "`--reward_pretrain` without `--remote_rm_url` is a learned reward model: the "
                                "import writes the config and asks for the `reward.url` of a server that runs it "
                                "(exit 1); the other estimators are read as the "
                                "key table says; `n_samples_per_prompt` 1; vLLM engines; `--colocate_all_models` "
                                "shares the GPUs only without `--async_train`; `--enable_vllm_is_correction` "
                                "truncates at [0.5, 5.0] (v0.8.9 to v0.9.0 at 2, as the older "
                                "`--vllm_enable_is_correction`), ICEPOP "
                                "rejects outside it."))
