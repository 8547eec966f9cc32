"""TRL (huggingface/trl): GRPOTrainer, synchronous or asynchronous GRPO; a `GRPOConfig(...)`."""

from __future__ import annotations

from fasync.frameworks.common import (
    ADAPT,
    CONVERTED,
    NONE,
    SAME,
    TRACKERS,
    Choice,
    Expressed,
    Framework,
    Imported,
    ImportFailure,
    Source,
    geometry,
    import_choices,
)

ROWS = [
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
    ("num_iterations", "train.ppo_epochs", SAME, "TRL's μ: passes over each generation batch."),
    ("importance_sampling_level", "train.importance_ratio", CONVERTED,
     "token is the token ratio, sequence GSPO's sequence ratio (train.importance_ratio: sequence)."),
    ("top_k", "rollout.top_k", CONVERTED, "null and 0 (no cut) are null."),
    ("warmup_steps", "train.lr_warmup_steps", SAME, "optimizer steps in both."),
    ("warmup_ratio", "train.lr_warmup_steps", CONVERTED, "a fraction of max_steps, in optimizer steps."),
    ("lr_scheduler_type", "train.lr_schedule", CONVERTED,
     "constant, linear and cosine are the same (TRL's default is linear, fasync's constant); the others have no "
     "equivalent."),
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
     "grpo averages per sequence (sequence_mean); dapo and bnpo per token (token_mean); dr_grpo divides each "
     "sequence's sum by max_completion_length (seq_mean_token_sum_norm)."),
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
    ("model", "model.path", SAME, "the model the trainer loads; fasync loads local directories only."),
    ("model_name_or_path", "model.path", SAME, "fasync loads local directories only, never a hub name."),
    ("use_peft", (), NONE, "LoRA: not supported yet."),
    ("max_tool_calling_iterations", "rollout.max_turns", CONVERTED,
     "tool-calling turns; fasync counts model turns, the one after the last tool call too: this + 1."),
    ("environment_factory", "rollout.env", ADAPT,
     "TRL's environment (`reset(**kwargs)` gives the first text, its public methods are the tools, the reward "
     "function reads its state) is a `rollout.env`: `reset(task)` → messages, `tools` name → function, "
     "`step(model_text)` → Step(messages, reward, done) (docs/agentic.md#environments-and-the-multi-turn-loop)."),
    ("reward_funcs", "reward.function", CONVERTED,
     "trl.rewards' accuracy_reward (math-verify against the solution column) is math_verify; TRL calls its own "
     "functions as f(completions, **columns) on a batch and sums several: the import asks for one "
     "reward.function, batched, naming `completion` and `label` (or `record` for other columns); a reward model's "
     "id is refused as not supported."),
]


CHOICES = [
    Choice("loss_type", {"grpo": {"train.loss_aggregation": "sequence_mean"},
                         "dapo": {"train.loss_aggregation": "token_mean"},
                         "bnpo": {"train.loss_aggregation": "token_mean"},
                         "dr_grpo": {"train.loss_aggregation": "seq_mean_token_sum_norm"}}),
    Choice("importance_sampling_level", {level: {"train.importance_ratio": level} for level in ("token", "sequence")}),
    Choice("lr_scheduler_type", {name: {"train.lr_schedule": name} for name in ("constant", "linear", "cosine")}),
    Choice("scale_rewards", {"group": {"train.normalize_advantage_std": True},
                             "none": {"train.normalize_advantage_std": False},
                             True: {"train.normalize_advantage_std": True},
                             False: {"train.normalize_advantage_std": False}}),
]
"""TRL's settings whose values name an algorithm."""


ASYNC_CONFIG = "AsyncGRPOConfig"
DEFAULTS = {"num_generations": 8, "learning_rate": 1e-6, "max_completion_length": 256,
            "per_device_train_batch_size": 8}
"""GRPOConfig's defaults where they differ from fasync's (trl/trainer/grpo_config.py)."""
ASYNC_DEFAULTS = {**DEFAULTS, "max_completion_length": 2048, "max_staleness": 4, "weight_sync_steps": 1,
                  "queue_maxsize": 1024}
"""AsyncGRPOConfig's (trl/experimental/async_grpo/async_grpo_config.py); queue_maxsize counts samples."""


def import_into(source: Source, out: Imported) -> set[str]:
    """GRPOTrainer generates, then trains (sync); AsyncGRPOTrainer (an AsyncGRPOConfig, or max_staleness)
    streams from a vLLM server, one drain per optimizer step. The number of processes is the launcher's
    (`--env NUM_PROCESSES=N`, default 1)."""
    asynchronous = source.script == ASYNC_CONFIG or "max_staleness" in source.values
    defaults = ASYNC_DEFAULTS if asynchronous else DEFAULTS

    def value(key: str):
        return source.get(key, defaults.get(key))

    def cite(key: str) -> str:
        return source.cite(key, defaults.get(key))

    converted = import_choices(CHOICES, source, out)
    if source.get("top_k"):
        out.set("rollout.top_k", source.get("top_k"), source.cite("top_k"))
    converted |= _warmup(source, out)
    per_device, generations = value("per_device_train_batch_size"), value("num_generations")
    accumulation = source.get("gradient_accumulation_steps", 1)
    processes = int(source.variables.get("NUM_PROCESSES", source.get("num_processes", 1)))
    per_step = per_device * processes * accumulation
    if per_step < generations:
        raise ImportFailure(f"not supported: a step of {per_step} samples ({cite('per_device_train_batch_size')} × "
                            f"{processes} processes × {accumulation}) is smaller than a group of {generations} "
                            "(num_generations): fasync steps on whole prompt groups")
    for key, target in (("learning_rate", "train.lr"), ("max_completion_length", "rollout.max_new_tokens")):
        out.set(target, value(key), cite(key))
    out.set("rollout.n_samples_per_prompt", generations, cite("num_generations"))
    out.set("train.global_batch_size", per_step, f"{cite('per_device_train_batch_size')} × {processes} processes "
            f"(NUM_PROCESSES) × {source.cite('gradient_accumulation_steps', 1)} = {per_step} samples")
    samples = per_step if asynchronous else source.get(
        "generation_batch_size", per_device * processes * source.get("steps_per_generation", accumulation))
    steps_per_drain = max(samples // per_step, 1)
    out.set("rollout.batch_size", max(samples // generations, 1),
            f"{samples} samples per generation / {generations} generations = {samples // generations} prompts")
    if processes > 1:
        out.set("resources.trainer_ranks", processes, f"NUM_PROCESSES {processes}")
    if "max_steps" in source.values:
        out.set("train.num_rollouts", max(source.get("max_steps") // steps_per_drain, 1),
                f"{source.cite('max_steps')} optimizer steps / {steps_per_drain} per generation")
    if asynchronous:
        _asynchronous(source, out, value, cite, per_step, generations, steps_per_drain, processes)
    else:
        out.set("mode", "sync", "TRL's GRPOTrainer generates, then trains")
        if source.get("use_vllm"):
            out.set("rollout.engine", "vllm", source.cite("use_vllm"))
    _correction(source, out)
    _reward(source, out)
    if isinstance(source.get("max_tool_calling_iterations"), int):
        turns = source.get("max_tool_calling_iterations") + 1
        out.set("rollout.max_turns", turns, f"{source.cite('max_tool_calling_iterations')} tool calls + the last turn")
    _trackers(source, out)
    return converted | {
        "top_k", "gradient_accumulation_steps", "steps_per_generation", "generation_batch_size", "num_processes",
        "weight_sync_steps", "report_to", "max_steps", "learning_rate", "max_completion_length", "num_generations",
        "per_device_train_batch_size", "max_staleness", "queue_maxsize", "max_inflight_tasks", "use_vllm",
        "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_cap",
        "reward_funcs", "max_tool_calling_iterations"}



def _warmup(source: Source, out: Imported) -> set[str]:
    """warmup_ratio as fasync's steps, where the run's length (max_steps) is known and no warmup_steps wins."""
    if "warmup_ratio" in source.values and "warmup_steps" not in source.values and "max_steps" in source.values:
        warmup = int(source.get("warmup_ratio") * source.get("max_steps"))
        out.set("train.lr_warmup_steps", warmup, f"{source.cite('warmup_ratio')} × {source.cite('max_steps')}")
        return {"warmup_ratio"}
    return set()


def _trackers(source: Source, out: Imported) -> None:
    """report_to: one name, a list, or "all"; the ones fasync has."""
    if "report_to" in source.values:
        wanted = source.get("report_to")
        wanted = TRACKERS if wanted == "all" else [wanted] if isinstance(wanted, str) else wanted or []
        out.set_trackers({name: source.cite("report_to") for name in wanted if name in TRACKERS})

TRL_REWARDS = {"accuracy_reward": ("math_verify", "trl.rewards' accuracy_reward verifies the completion against "
                                   "the solution with math-verify (data.label_key: the solution column)")}
"""TRL's own reward functions → the fasync built-in that scores alike."""


def _reward(source: Source, out: Imported) -> None:
    """The trainer's reward_funcs: TRL's accuracy_reward is math_verify; a model id is a learned reward model;
    the script's own functions take TRL's batch of completions and dataset columns, which the import asks to
    adapt."""
    functions = source.get("reward_funcs") or []
    models = [f for f in functions if "/" in f]
    if models:
        raise ImportFailure(f"not supported: a learned reward model (reward_funcs {', '.join(models)}); fasync "
                            "rewards are functions of the completion and the label")
    if len(functions) == 1 and functions[0] in TRL_REWARDS:
        builtin, why = TRL_REWARDS[functions[0]]
        out.set("reward.function", builtin, f"{source.cite('reward_funcs')}: {why}")
    elif functions and "environment_factory" in source.values:
        out.unmapped.append(("reward_funcs", functions, "with an environment_factory, TRL's reward functions read "
                             "the environments' state: the rollout.env's steps give the reward"))
    elif functions:
        out.need("reward.function", f"TRL's {source.cite('reward_funcs')}: TRL calls each as f(completions, "
                 "**columns) on a batch and sums them; fasync: one reward.function with reward.batched: true "
                 "naming `completion` and `label` (or `record`) lists, returning a list of floats")


def _asynchronous(source: Source, out: Imported, value, cite, per_step: int, generations: int, steps_per_drain: int,
                  processes: int) -> None:
    staleness = value("max_staleness")
    out.set("mode", "fully_async", f"{source.script or 'max_staleness'}: TRL's async GRPO streams from a vLLM server")
    out.set("async.max_weight_staleness", staleness, cite("max_staleness"))
    interval = max(value("weight_sync_steps") // steps_per_drain, 1)
    out.set("async.update_weights_interval", interval, f"{cite('weight_sync_steps')} optimizer steps / "
            f"{steps_per_drain} per drain = {interval}")
    queue = value("queue_maxsize")
    out.set("async.max_queue_size", max(queue // generations, 1), f"{cite('queue_maxsize')} samples / {generations}")
    inflight = source.get("max_inflight_tasks")
    out.set("async.max_concurrent_samples", inflight if isinstance(inflight, int) else staleness * per_step,
            source.cite("max_inflight_tasks") if isinstance(inflight, int) else
            f"max_inflight_tasks auto: max_staleness {staleness} × {per_step} samples per step")
    out.set("correction.ratio_anchor", "behaviour", "AsyncGRPOTrainer takes the PPO ratio against vLLM's logprobs")
    out.set("rollout.engine", "vllm", "AsyncGRPOTrainer generates with a vLLM server")
    out.set("resources.trainer_ranks", processes, f"NUM_PROCESSES {processes}")
    out.set("resources.gpus_per_trainer_rank", 1, "one GPU per process")
    out.set("resources.num_rollout_engines", 1, "one vLLM server")
    out.set("resources.gpus_per_engine", 1, "the vLLM server's GPUs are set outside the file: one assumed")
    out.set("resources.colocate", False, "the vLLM server runs apart from training")
    out.set("resources.num_gpus", processes + 1, f"{processes} training processes + 1 vLLM server GPU")


def _correction(source: Source, out: Imported) -> None:
    """vllm_importance_sampling_correction: its mode (sequence_mask by default) and cap (3.0)."""
    if not source.get("vllm_importance_sampling_correction"):
        return
    mode = source.get("vllm_importance_sampling_mode", "sequence_mask")
    cap = float(source.get("vllm_importance_sampling_cap", 3.0))
    level = "sequence" if mode.startswith("sequence") else "token"
    why = f"{source.cite('vllm_importance_sampling_correction')}, {source.cite('vllm_importance_sampling_mode', mode)}"
    out.set("correction.level", level, why)
    if mode.endswith("mask"):
        out.set(f"correction.reject_{level}_ratio", [0.0, cap],
                f"{source.cite('vllm_importance_sampling_cap', cap)}: ratios above it are masked")
    else:
        out.set("correction.weight_upper", cap, source.cite("vllm_importance_sampling_cap", cap))


def express(cfg, derived) -> Expressed:
    prompts, n, per_step, steps, bound, interval = geometry(cfg, derived)
    out = Expressed(FRAMEWORK, "python")
    micro = derived.micro_batch_size if per_step % derived.micro_batch_size == 0 else per_step
    accumulation = per_step // micro
    out.put("per_device_train_batch_size", micro, "train.micro_batch_size")
    out.put("gradient_accumulation_steps", accumulation, f"{per_step} samples per step / {micro}")
    out.put("num_generations", n, "rollout.n_samples_per_prompt")
    for choice in CHOICES:
        choice.express(cfg, out, choice.key)
    train = cfg.train
    for key, value, default, why in (("num_iterations", train.ppo_epochs, 1, "train.ppo_epochs"),
                                     ("warmup_steps", train.lr_warmup_steps, 0, "train.lr_warmup_steps"),
                                     ("top_k", cfg.rollout.top_k, None, "rollout.top_k")):
        if value != default:
            out.put(key, value, why)
    out.note_algorithm(cfg, ("train.normalize_advantage_std", "train.loss_aggregation", "train.importance_ratio",
                             "train.lr_schedule", "train.ppo_epochs", "train.lr_warmup_steps", "rollout.top_k"))
    out.note_trimmed_samples(derived)
    if cfg.mode == "sync":
        out.put("steps_per_generation", steps * accumulation, f"{steps} optimizer steps × {accumulation} micro-steps "
                "each")
        return out
    out.config_class = ASYNC_CONFIG
    if cfg.mode == "async":
        out.missing.append("mode async: TRL's asynchronous GRPO streams (mode: fully_async)")
    if steps != 1:
        out.missing.append(f"{steps} optimizer steps per drain: TRL's async GRPO takes one optimizer step per "
                           "batch it draws")
    out.put("max_staleness", bound if bound is not None else 0, "async.max_weight_staleness")
    out.put("weight_sync_steps", interval, f"{interval} drains of one optimizer step each")
    if bound is None:
        out.missing.append("no staleness bound: TRL's max_staleness is always a number")
    return out


FRAMEWORK = Framework("trl", "TRL", ROWS, import_into, express,
                      reward_keys=("the trainer's reward_funcs",),
                      rewards=("The trainer's `reward_funcs`: trl.rewards' `accuracy_reward` is `reward.function: "
                               "math_verify` (both verify with math-verify); the script's own functions, called as "
                               "`f(completions, **columns)` on a batch and summed, ask for one batched "
                               "`reward.function` of the fields it names; a reward model's id is refused as not "
                               "supported. `environment_factory` (multi-turn tool calling) asks for a `rollout.env`, and "
                               "`max_tool_calling_iterations` + 1 is `rollout.max_turns`."),
                      modes=("`GRPOConfig(...)` is `sync`; `AsyncGRPOConfig(...)` (or `max_staleness`) is "
                             "`fully_async`, one drain per optimizer step, generated by a vLLM server with the PPO "
                             "ratio against its logprobs. A script driven by TrlParser that sets no config keyword "
                             "is read from the command line its docstring gives."),
                      defaults=("GRPOConfig: 8 generations, `learning_rate` 1e-6, `max_completion_length` 256, 8 "
                                "samples per device; AsyncGRPOConfig: `max_completion_length` 2048, `max_staleness` "
                                "4, `weight_sync_steps` 1, `queue_maxsize` 1024 samples, `max_inflight_tasks` "
                                "max_staleness × samples per step. Processes come from `--env NUM_PROCESSES=N` "
                                "(default 1). A step smaller than a group is refused as not supported."))
