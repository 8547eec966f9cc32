"""TRL (huggingface/trl): GRPOTrainer, synchronous or asynchronous GRPO; a `GRPOConfig(...)`."""

from __future__ import annotations

from fasync.frameworks.common import (
    CONVERTED,
    SAME,
    TRACKERS,
    Choice,
    Expressed,
    Framework,
    Imported,
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


def import_into(source: Source, out: Imported) -> set[str]:
    converted = import_choices(CHOICES, source, out)
    if source.get("top_k"):
        out.set("rollout.top_k", source.get("top_k"), source.cite("top_k"))
    if "warmup_ratio" in source.values and "warmup_steps" not in source.values and "max_steps" in source.values:
        warmup = int(source.get("warmup_ratio") * source.get("max_steps"))
        out.set("train.lr_warmup_steps", warmup, f"{source.cite('warmup_ratio')} × {source.cite('max_steps')}")
        converted.add("warmup_ratio")
    per_device = source.get("per_device_train_batch_size", 8)
    accumulation = source.get("gradient_accumulation_steps", 1)
    processes = source.get("num_processes", 1)
    generations = source.get("num_generations", 8)
    steps_per_generation = source.get("steps_per_generation", accumulation)
    samples = source.get("generation_batch_size", per_device * processes * steps_per_generation)
    out.set("rollout.n_samples_per_prompt", generations, source.cite("num_generations", 8))
    out.set("train.global_batch_size", per_device * processes * accumulation,
            f"{source.cite('per_device_train_batch_size', 8)} × {source.cite('num_processes', 1)} processes × "
            f"{source.cite('gradient_accumulation_steps', 1)} = {per_device * processes * accumulation} samples")
    out.set("rollout.batch_size", max(samples // generations, 1),
            f"{per_device} × {processes} × {source.cite('steps_per_generation', accumulation)} = {samples} samples per "
            f"generation / {generations} generations = {samples // generations} prompts")
    if processes > 1:
        out.set("resources.trainer_ranks", processes, source.cite("num_processes"))
    if "max_staleness" in source.values:
        out.set("mode", "fully_async", f"{source.cite('max_staleness')}: TRL's async GRPO")
    else:
        out.set("mode", "sync", "TRL's GRPOTrainer generates, then trains")
    if "weight_sync_steps" in source.values:
        steps_per_drain = max(samples // (per_device * processes * accumulation), 1)
        interval = max(source.get("weight_sync_steps") // steps_per_drain, 1)
        out.set("async.update_weights_interval", interval,
                f"{source.cite('weight_sync_steps')} optimizer steps / {steps_per_drain} per generation = {interval}")
    if "report_to" in source.values:
        wanted = source.get("report_to")
        wanted = TRACKERS if wanted == "all" else [wanted] if isinstance(wanted, str) else wanted or []
        out.set_trackers({name: source.cite("report_to") for name in wanted if name in TRACKERS})
    return converted | {"top_k", "gradient_accumulation_steps", "steps_per_generation", "generation_batch_size", "num_processes",
            "weight_sync_steps", "report_to"}


def express(cfg, derived) -> Expressed:
    prompts, n, per_step, steps, bound, interval = geometry(cfg, derived)
    out = Expressed(FRAMEWORK, "python")
    micro = derived.micro_batch_size if per_step % derived.micro_batch_size == 0 else per_step
    accumulation = per_step // micro
    out.put("per_device_train_batch_size", micro, "train.micro_batch_size")
    out.put("gradient_accumulation_steps", accumulation, f"{per_step} samples per step / {micro}")
    out.put("num_generations", n, "rollout.n_samples_per_prompt")
    out.put("steps_per_generation", steps * accumulation, f"{steps} optimizer steps × {accumulation} micro-steps each")
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
    if cfg.mode == "async":
        out.missing.append("mode async: TRL's asynchronous GRPO streams (mode: fully_async)")
    if cfg.mode != "sync":
        out.put("max_staleness", bound if bound is not None else 0, "async.max_weight_staleness")
        out.put("weight_sync_steps", interval * steps, f"{interval} drains × {steps} optimizer steps")
        if bound is None:
            out.missing.append("no staleness bound: TRL's max_staleness is always a number")
    return out


FRAMEWORK = Framework("trl", "TRL", ROWS, import_into, express)
