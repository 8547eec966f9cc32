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
    ("model.name", "model.path", CONVERTED, "a hub name; fasync loads a local directory."),
    ("seq_len", (), NONE, "prime-rl's training sequence length; fasync pads each micro batch to its longest sample."),
    ("orchestrator.*", (), NONE, "environment and transport settings have no fasync equivalent."),
    ("ckpt.*", "checkpoint.save_final", CONVERTED, "a [ckpt] section saves checkpoints."),
    ("deployment.*", (), NONE, NESTED.format(source="prime-rl")),
    ("monitors.*", (), NONE, "monitoring has no fasync equivalent (fasync writes metrics.jsonl)."),
]


def import_into(source: Source, out: Imported) -> set[str]:
    out.set("mode", "fully_async", "prime-rl's orchestrator streams rollouts to the trainer")
    batch, group = source.get("orchestrator.batch_size"), source.get("orchestrator.group_size", 1)
    if batch is not None:
        out.set("train.global_batch_size", batch, f"{source.cite('orchestrator.batch_size')} samples per step")
        out.set("rollout.batch_size", max(batch // group, 1),
                f"{source.cite('orchestrator.batch_size')} / {source.cite('orchestrator.group_size', 1)} prompts")
    if "orchestrator.max_off_policy_steps" not in source.values:
        out.set("async.max_weight_staleness", 8, "orchestrator.max_off_policy_steps 8 (the prime-rl default)")
    return {"orchestrator.batch_size"}


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


FRAMEWORK = Framework("prime-rl", "prime-rl", ROWS, import_into, express)
