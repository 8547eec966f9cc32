"""B: batch geometry — how a rollout's samples become optimizer steps and micro batches.

The arithmetic is `fasync.config.derived` (what the trainer's `fasync.train.batching` follows):
samples per rollout = rollout.batch_size × n_samples_per_prompt; num_steps_per_rollout steps of
effective_global_batch_size samples; the rest is trimmed.
"""

from __future__ import annotations

from fasync.diagnostics import Severity
from fasync.lint.registry import Finding, rule
from fasync.lint.rules.facts import plural, set_keys, unit


def _rollout_size(cfg, derived) -> str:
    return (f"{derived.samples_per_rollout} samples ({cfg.rollout.batch_size} prompts × "
            f"{cfg.rollout.n_samples_per_prompt})")


def _fixed_global_batch(cfg) -> bool:
    return not cfg.train.use_dynamic_global_batch_size


@rule(
    "B001", "micro-batch-split", Severity.ERROR,
    summary="The global batch does not split into whole micro batches on every trainer rank.",
    what="Reports a global batch (`train.global_batch_size`, or the whole rollout under "
    "`train.use_dynamic_global_batch_size`) that is not a multiple of the micro batch (`train.micro_batch_size`, "
    "by default the per-rank batch) × "
    "`resources.trainer_ranks`, including the cases where a rank would get less than one micro batch or "
    "no sample at all.",
    why="Each trainer rank takes every `trainer_ranks`-th sample of a step and accumulates gradients over "
    "micro batches of `micro_batch_size`. When the numbers do not divide, the ranks get unequal shares and "
    "end with a short micro batch (or none), so the memory and time per step are not the ones the config "
    "was sized for, every rank waits at the gradient all-reduce for the one with the largest share, and a "
    "rank with no sample contributes only zeros. The same checks are hard errors in verl "
    "(ppo_mini_batch_size against ppo_micro_batch_size_per_gpu and the world size).",
)
def micro_batch_split(cfg, derived):
    batch = derived.effective_global_batch_size
    micro, ranks = derived.micro_batch_size, cfg.resources.trainer_ranks
    step_unit = micro * ranks
    if batch % step_unit == 0:
        return
    if _fixed_global_batch(cfg):
        subject = f"the global batch of {batch} samples"
    else:
        subject = f"the dynamic global batch (the whole rollout, {batch} samples)"
    if ranks > batch:
        problem = f"{subject} cannot give each of the {ranks} trainer ranks a sample"
    elif micro > batch // ranks:
        problem = (f"{subject} gives each of the {ranks} trainer ranks {batch // ranks} samples, fewer than one "
                   f"micro batch of {micro}")
    else:
        problem = f"{subject} is not a multiple of micro batch {micro} × {plural(ranks, 'trainer rank')} = {step_unit}"
    lower = batch // step_unit * step_unit
    multiples = " or ".join(str(m) for m in (lower, lower + step_unit) if m > 0)
    if _fixed_global_batch(cfg):
        fix = f"set `train.global_batch_size` to {multiples}"
    else:
        fix = f"make the rollout {multiples} samples (`rollout.batch_size` × `rollout.n_samples_per_prompt`)"
    if batch % ranks == 0:
        fix += f", or `train.micro_batch_size` to a divisor of the {batch // ranks} samples per rank"
    yield Finding(_split_key(cfg), problem, fix)


def _split_key(cfg) -> str:
    """The setting that makes the split fail, among those the config writes: the global batch, the micro batch,
    the ranks, or (when the global batch is the whole rollout) the rollout size."""
    written = set_keys(cfg)
    if _fixed_global_batch(cfg) and "train.global_batch_size" in written:
        return "train.global_batch_size"
    for key in ("train.micro_batch_size", "resources.trainer_ranks", "rollout.n_samples_per_prompt"):
        if key in written:
            return key
    return "rollout.batch_size"


@rule(
    "B002", "steps-overfill-rollout", Severity.ERROR,
    summary="`train.num_steps_per_rollout` asks for more samples than a rollout has.",
    what="Reports an explicit `train.num_steps_per_rollout` whose steps of `train.global_batch_size` "
    "samples need more than one rollout (fully_async: one drain) provides: num_steps_per_rollout × "
    "global_batch_size > rollout.batch_size × n_samples_per_prompt, while at least one global batch fits "
    "(fewer samples than one global batch is B003). Fewer steps than fit is not an error but trims the "
    "rest of the rollout (B004).",
    why="The trainer takes only the steps the samples can fill (min(num_steps_per_rollout, samples // "
    "global_batch_size)), so it silently runs fewer optimizer steps than configured, while every derived "
    "quantity (`fasync config show`, the worst policy lag, the staleness warning S001) is computed from the "
    "configured number.",
)
def steps_overfill_rollout(cfg, derived):
    steps, batch = cfg.train.num_steps_per_rollout, derived.effective_global_batch_size
    samples = derived.samples_per_rollout
    if steps is None or not _fixed_global_batch(cfg) or samples < batch or steps * batch <= samples:
        return
    fit = samples // batch
    fix = f"set `train.num_steps_per_rollout` to {fit} (or null to derive it)"
    if samples % steps == 0:
        fix += f", or `train.global_batch_size` to {samples // steps}"
    yield Finding(
        "train.num_steps_per_rollout",
        f"{plural(steps, 'step')} × global batch {batch} = {steps * batch} samples, but a {unit(cfg.mode)} has "
        f"{_rollout_size(cfg, derived)}: only {plural(fit, 'full step')} fit, and the trainer takes only those",
        fix,
    )


@rule(
    "B003", "rollout-below-global-batch", Severity.ERROR,
    summary="A rollout has fewer samples than one global batch.",
    what="Reports rollout.batch_size × n_samples_per_prompt below `train.global_batch_size` (without "
    "`train.use_dynamic_global_batch_size`): not even one optimizer step of the configured size fits in a "
    "rollout (fully_async: a drain).",
    why="The derived number of optimizer steps per rollout is 0, which is what `fasync config show` and the "
    "lag figures use, while the trainer, rather than train on nothing, makes the short rollout one smaller "
    "step: the configured global batch size is never the one that runs, nor is the learning rate tuned for "
    "it. verl rejects the same geometry (train_batch_size below ppo_mini_batch_size).",
)
def rollout_below_global_batch(cfg, derived):
    batch, samples = derived.effective_global_batch_size, derived.samples_per_rollout
    if not _fixed_global_batch(cfg) or samples >= batch:
        return
    prompts_needed = -(-batch // cfg.rollout.n_samples_per_prompt)
    yield Finding(
        "train.global_batch_size",
        f"a {unit(cfg.mode)} has {_rollout_size(cfg, derived)}, fewer than one global batch of {batch}",
        f"set `train.global_batch_size` to {samples} (or `train.use_dynamic_global_batch_size: true`), "
        f"or raise `rollout.batch_size` to {prompts_needed}",
    )


@rule(
    "B004", "samples-trimmed", Severity.WARNING,
    summary="Samples are generated every rollout and never trained on.",
    what="Reports a rollout (fully_async: a drain) that does not divide into its optimizer steps: samples "
    "per rollout − num_steps_per_rollout × global_batch_size samples are trimmed each time. The message "
    "gives how many and what fraction.",
    why="Generation is most of the cost of a step of RL training, and trimmed samples were paid for in full; "
    "they are counted as dropped (`trimmed`) in the sample ledger. Which samples are trimmed is random (after "
    "shuffling), so some prompt groups are trained on only in part.",
)
def samples_trimmed(cfg, derived):
    trimmed, samples = derived.trimmed_samples_per_rollout, derived.samples_per_rollout
    batch, steps = derived.effective_global_batch_size, derived.num_steps_per_rollout
    if not _fixed_global_batch(cfg) or trimmed == 0 or samples < batch:
        return
    fit = samples // batch
    step_unit = derived.micro_batch_size * cfg.resources.trainer_ranks
    if cfg.train.num_steps_per_rollout is not None and steps < fit:
        key = "train.num_steps_per_rollout"
        fix = f"set `train.num_steps_per_rollout` to {fit} or null"
    else:
        key = "train.global_batch_size"
        exact = [samples // k for k in (steps, steps + 1) if samples % k == 0 and (samples // k) % step_unit == 0]
        fix = f"set `train.global_batch_size` to {exact[0]}" if exact else "make the rollout a multiple of the global batch"
    yield Finding(
        key,
        f"{trimmed} of the {samples} samples of each {unit(cfg.mode)} ({100 * trimmed / samples:.1f}%) are generated "
        f"and never trained on: {plural(steps, 'step')} × global batch {batch} = {steps * batch}",
        f"{fix}, or `train.use_dynamic_global_batch_size: true`",
    )


@rule(
    "B005", "over-sampling-below-batch", Severity.ERROR,
    summary="`rollout.over_sampling_batch_size` is smaller than `rollout.batch_size`.",
    what="Reports an `over_sampling_batch_size` below `batch_size`. With dynamic sampling, the first round "
    "generates `batch_size` prompts and every further round `over_sampling_batch_size`, until the batch is "
    "full or `max_sampling_rounds` rounds have run.",
    why="Over-sampling exists so that a refill round still fills the batch after the groups with no reward "
    "variance are dropped. A refill round smaller than the batch under-samples: more rounds, each a full "
    "generation pass with its slowest completion in the tail, and a short batch when the rounds run out. "
    "slime documents its flag of the same name as larger than rollout_batch_size.",
)
def over_sampling_below_batch(cfg, derived):
    over, batch = cfg.rollout.over_sampling_batch_size, cfg.rollout.batch_size
    if over is not None and over < batch:
        yield Finding(
            "rollout.over_sampling_batch_size",
            f"`rollout.over_sampling_batch_size` {over} is below `rollout.batch_size` {batch}: each refill round "
            f"generates fewer prompts than one batch",
            f"set `rollout.over_sampling_batch_size` to at least {batch} (null means {batch})",
        )


@rule(
    "B006", "dynamic-batch-overrides-steps", Severity.WARNING,
    summary="`train.num_steps_per_rollout` is set but the dynamic global batch makes every rollout one step.",
    what="Reports an explicit `train.num_steps_per_rollout` other than 1 together with "
    "`train.use_dynamic_global_batch_size: true`.",
    why="The dynamic global batch resizes the step to the whole rollout, so every rollout is exactly one "
    "optimizer step and the configured number of steps is ignored: the config says two different things and "
    "the trainer follows only one of them.",
)
def dynamic_batch_overrides_steps(cfg, derived):
    steps = cfg.train.num_steps_per_rollout
    if not cfg.train.use_dynamic_global_batch_size or steps in (None, 1):
        return
    yield Finding(
        "train.num_steps_per_rollout",
        f"`train.num_steps_per_rollout` {steps} is overridden by `train.use_dynamic_global_batch_size`: every "
        f"{unit(cfg.mode)} is one optimizer step of all its {derived.samples_per_rollout} samples",
        f"remove `train.num_steps_per_rollout`, or set `train.use_dynamic_global_batch_size: false` to take "
        f"{steps} steps per {unit(cfg.mode)}",
    )
