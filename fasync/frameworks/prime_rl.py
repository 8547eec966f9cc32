"""prime-rl (PrimeIntellect-ai/prime-rl): an orchestrator that streams rollouts to the trainer; a TOML config."""

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
    ("model.name", "model.path", SAME, "a hub name; fasync loads local directories only."),
    ("trainer.model.lora.*", (), NONE, "LoRA: not supported yet."),
    ("seq_len", (), NONE, "prime-rl's training sequence length; fasync pads each micro batch to its longest sample."),
    ("orchestrator.*", (), NONE, "environment and transport settings have no fasync equivalent."),
    ("ckpt.interval", "checkpoint.every", SAME, "optimizer steps in both (one per batch)."),
    ("ckpt.*", "checkpoint.save_final", CONVERTED, "a [ckpt] section saves checkpoints."),
    ("deployment.*", (), NONE, NESTED.format(source="prime-rl")),
    ("monitors.*", (), NONE, "monitoring has no fasync equivalent (fasync writes metrics.jsonl)."),
]


ORCHESTRATOR_FILE_DEFAULT_STALENESS = 2
"""The older orchestrator-only file's async_level default (src/prime_rl/orchestrator/config.py)."""
MAX_OFF_POLICY_STEPS = 8
"""OrchestratorConfig.max_off_policy_steps's default."""
GPUS_PER_NODE = 8
"""prime-rl's multi-node deployment counts nodes of 8 GPUs."""


def import_into(source: Source, out: Imported) -> set[str]:
    """prime-rl always streams; its group size defaults to 1 (fasync's to 8) and its bound to 8 versions (2 in
    the older orchestrator-only file, whose keys sit at the top level)."""
    out.set("mode", "fully_async", "prime-rl's orchestrator streams rollouts to the trainer")
    group_key = next((k for k in ("orchestrator.group_size", "orchestrator.rollouts_per_example")
                      if k in source.values), "orchestrator.group_size")
    group = source.get(group_key, 1)
    out.set("rollout.n_samples_per_prompt", group, source.cite(group_key, 1))
    batch = source.get("orchestrator.batch_size")
    if batch is not None:
        out.set("train.global_batch_size", batch, f"{source.cite('orchestrator.batch_size')} samples per step")
        out.set("rollout.batch_size", max(batch // group, 1),
                f"{source.cite('orchestrator.batch_size')} / {source.cite(group_key, 1)} prompts")
    bound_key = next((k for k in ("orchestrator.max_off_policy_steps", "orchestrator.async_level", "max_async_level")
                      if k in source.values), None)
    if bound_key is None:
        default = ORCHESTRATOR_FILE_DEFAULT_STALENESS if source.orchestrator_file else MAX_OFF_POLICY_STEPS
        name = "async_level" if source.orchestrator_file else "orchestrator.max_off_policy_steps"
        out.set("async.max_weight_staleness", default, f"{name} {default} (the prime-rl default)")
    out.set("rollout.engine", "vllm", "prime-rl's inference server is vLLM")
    if any(key == "ckpt" or key.startswith("ckpt.") for key in source.values):
        out.set("checkpoint.save_final", True, "a [ckpt] section: prime-rl saves the final checkpoint")
    _resources(source, out)
    if not any(key.endswith(("max_completion_tokens", "max_tokens")) for key in source.values):
        out.unmapped.append(("seq_len", source.get("orchestrator.seq_len", source.get("seq_len")),
                             "no completion cap: prime-rl bounds a completion by seq_len minus its prompt, which has "
                             "no fixed fasync value; set rollout.max_new_tokens"))
    environments = _environments(source)
    multi_turn = any("max_turns" in str(value) for value in source.values.values())
    if environments:
        out.need("rollout.env" if multi_turn else "reward.function", f"prime-rl's environment "
                 f"{', '.join(environments)} is a verifiers environment (its dataset, prompts and rubric): its dataset "
                 "is data.path and " + ("its turns a rollout.env class, reset(task) and step(model_text) giving the "
                                        "rubric's reward (docs/agentic.md)" if multi_turn else
                                        "its rubric a reward.function of (completion, label)"))
    return {"orchestrator.batch_size", group_key, "ckpt", "deployment.num_train_gpus", "deployment.num_infer_gpus",
            "deployment.num_train_nodes", "deployment.num_infer_nodes", "inference.vllm.tensor_parallel_size"}


def _environments(source: Source) -> list[str]:
    """The environments' ids: `[[orchestrator.train.env]]` (a taskset's id, or its name), the older
    `[[orchestrator.env]]` and an orchestrator file's `[environment]`."""
    names = []
    for env in [*(source.get("orchestrator.train.env") or []), *(source.get("orchestrator.env") or [])]:
        if isinstance(env, dict):
            taskset = env.get("taskset") if isinstance(env.get("taskset"), dict) else {}
            names.append(str(taskset.get("id") or env.get("id") or env.get("name")))
    if "orchestrator.environment.id" in source.values:
        names.append(str(source.get("orchestrator.environment.id")))
    return names


def _resources(source: Source, out: Imported) -> None:
    """deployment: trainer and inference GPUs (or nodes of 8 GPUs), inference in engines of the vLLM tensor
    parallel size."""
    tp = source.get("inference.vllm.tensor_parallel_size", 1)
    if "deployment.num_train_nodes" in source.values:
        trainer = source.get("deployment.num_train_nodes") * GPUS_PER_NODE
        infer = source.get("deployment.num_infer_nodes", 1) * GPUS_PER_NODE
        why = f"{source.cite('deployment.num_train_nodes')} and {source.cite('deployment.num_infer_nodes', 1)} " \
              f"nodes of {GPUS_PER_NODE} GPUs"
    elif "deployment.num_train_gpus" in source.values:
        trainer, infer = source.get("deployment.num_train_gpus"), source.get("deployment.num_infer_gpus", 1)
        why = f"{source.cite('deployment.num_train_gpus')}, {source.cite('deployment.num_infer_gpus', 1)}"
    else:
        return
    out.set("resources.trainer_ranks", trainer, why)
    out.set("resources.gpus_per_trainer_rank", 1, "one GPU per trainer rank")
    out.set("resources.num_rollout_engines", max(infer // tp, 1), f"{infer} inference GPUs / "
            f"{source.cite('inference.vllm.tensor_parallel_size', 1)}")
    out.set("resources.gpus_per_engine", tp, source.cite("inference.vllm.tensor_parallel_size", 1))
    out.set("resources.colocate", False, "prime-rl's trainer and inference run on their own GPUs")
    out.set("resources.num_gpus", trainer + infer, why)
    out.set("resources.gpus_per_node", GPUS_PER_NODE, f"nodes of {GPUS_PER_NODE} GPUs")


def express(cfg, derived) -> Expressed:
    prompts, n, per_step, steps, bound, interval = geometry(cfg, derived)
    out = Expressed(FRAMEWORK, "toml")
    if steps != 1:
        out.missing.append(f"{steps} optimizer steps per drain: prime-rl takes one step per batch")
    out.put("max_steps", cfg.train.num_rollouts, "train.num_rollouts")
    out.put("orchestrator.batch_size", prompts * n, f"{prompts} prompts × {n} samples per step")
    out.put("orchestrator.group_size", n, "rollout.n_samples_per_prompt")
    out.put_streaming_bound(cfg, "orchestrator.max_off_policy_steps")
    out.note_sync_every_step(interval)
    out.note_algorithm(cfg)
    return out


FRAMEWORK = Framework("prime-rl", "prime-rl", ROWS, import_into, express,
                      reward_keys=("orchestrator.train.env", "orchestrator.env", "environment.id"),
                      rewards=("An environment (`[[orchestrator.train.env]]`, the older `[[orchestrator.env]]` or "
                               "`[environment]`) is a verifiers environment, its dataset, prompts and rubric in "
                               "Python: the import asks for its dataset as `data.path` and its rubric as a "
                               "`reward.function`, or, for a multi-turn one (`max_turns`), a `rollout.env` whose "
                               "steps give the reward."),
                      modes="prime-rl always streams: `fully_async`, one optimizer step per batch.",
                      defaults=("`group_size` (older: `rollouts_per_example`) defaults to 1 where fasync's is 8, so "
                                "`rollout.n_samples_per_prompt` is always written; `max_off_policy_steps` 8 (an "
                                "older orchestrator-only file, its keys at the top level: `async_level` 2); vLLM "
                                "inference; `deployment` GPUs, or nodes of 8 GPUs, with the vLLM tensor parallel "
                                "size; a `[ckpt]` section saves the final checkpoint."))
