"""slime (THUDM/slime): train.py (synchronous) and train_async.py (one rollout ahead); argparse flags."""

from __future__ import annotations

from fasync.frameworks.common import (
    ADAPT,
    CONVERTED,
    NONE,
    SAME,
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
    ("advantage_estimator", ("train.advantage_estimator", "train.importance_ratio"), CONVERTED,
     "grpo, reinforce_plus_plus and reinforce_plus_plus_baseline are the same estimators; gspo is grpo with "
     "GSPO's sequence ratio (train.importance_ratio: sequence); ppo needs a critic."),
    ("lr_warmup_iters", "train.lr_warmup_steps", SAME, "Megatron's iterations are optimizer steps."),
    ("lr_decay_style", "train.lr_schedule", CONVERTED,
     "constant, linear and cosine are the same shapes (Megatron decays to min_lr over lr_decay_iters, fasync to 0 "
     "at the end of the run); inverse-square-root and WSD have no equivalent."),
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
    ("prompt_data", "data.path", SAME, "a JSONL file of prompt/label objects (parquet is not read yet)."),
    ("input_key", "data.prompt_key", SAME),
    ("label_key", "data.label_key", SAME),
    ("hf_checkpoint", "model.path", SAME, "the Hugging Face checkpoint the engines load; fasync loads local "
     "directories only."),
    ("custom_generate_function_path", "rollout.function", ADAPT,
     "slime's `async def generate(args, sample, sampling_params)` posts to SGLang and returns the Sample; fasync's "
     "`rollout.function` is `async def f(task, engine)`: the same loop with `engine.generate(token_ids)` (tokens, "
     "logprobs, versions) building a Trajectory, tool results added as observations "
     "(docs/agentic.md#custom-rollout-functions)."),
    ("custom_rm_path", "reward.function", ADAPT,
     "slime calls `reward_func(args, sample, **kwargs)` (sample.response, sample.label); fasync passes a reward "
     "the fields its parameters name: take `(completion, label)` (or `prompt`, `record`, verl's names) and return "
     "a float (docs/training.md#rewards)."),
    ("rm_type", ("reward.function", "reward.url"), CONVERTED,
     "math is boxed_math (the last \\boxed{} against the label); deepscaler and dapo are math_verify (the final "
     "answer compared as mathematics; dapo's -1 for a wrong answer is 0, the same advantages once each group is "
     "normalised by its std); boxed_TYPE is TYPE; remote_rm is reward.url; f1, gpqa, ifbench and random have no "
     "built-in: the import asks for reward.function."),
    ("rm_url", "reward.url", CONVERTED,
     "slime posts one {prompt, response, label} per request and reads the reward back; fasync posts "
     "{\"items\": [...]} batches and reads {\"rewards\": [...]}: the server needs that route "
     "(docs/training.md#a-remote-reward)."),
    ("reward_key", (), NONE, "the key slime reads from a reward that returns a dict (dapo's score); a fasync reward "
     "returns the number."),
    ("rollout_function_path", "mode", CONVERTED,
     "a fully-async rollout function (slime's examples/fully_async, miles' FullyAsyncRolloutFn) is `mode: "
     "fully_async`, which fasync's drivers do themselves; another custom one builds a whole rollout from the data "
     "buffer (`generate_rollout(args, rollout_id, data_buffer, evaluation)`): its per-sample generation is a "
     "`rollout.function`, `async def f(task, engine)` (docs/agentic.md#custom-rollout-functions)."),
]


MODES = ("`train.py` is `sync`; `train_async.py` runs one rollout ahead: `async` with `async.max_weight_staleness: "
         "1`; `--fully-async` (miles) or a fully-async rollout function (`--rollout-function-path ...fully_async...`: "
         "slime's examples/fully_async, miles' FullyAsyncRolloutFn) is `fully_async`, unbounded unless "
         "`--max-weight-staleness` is set (the example's queue has no version check).")
DEFAULTS = ("`--n-samples-per-prompt` 1, `--eps-clip` 0.2 with `--eps-clip-high` for the upper side, `--tis-clip` 2; "
            "without `--use-rollout-logprobs` the PPO ratio is taken against recomputed logprobs (`recompute`); "
            "`--actor-num-nodes` × `--actor-num-gpus-per-node` (default 8) trainer ranks and `--rollout-num-gpus` "
            "(the actor's under `--colocate`) in engines of `--rollout-num-gpus-per-engine`; SGLang becomes vLLM, "
            "fasync's tensor-parallel engine (with `--hf-checkpoint` as `model.path`).")


ESTIMATOR = Choice("advantage_estimator", {
    "gspo": {"train.advantage_estimator": "grpo", "train.importance_ratio": "sequence"},
    **{name: {"train.advantage_estimator": name, "train.importance_ratio": "token"}
       for name in ("grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")}})
CHOICES = [
    ESTIMATOR,
    Choice("lr_decay_style", {name: {"train.lr_schedule": name} for name in ("constant", "linear", "cosine")}),
]
"""slime's (and miles's) flags whose values name an algorithm."""


def import_into(source: Source, out: Imported) -> set[str]:
    """slime's, and miles's, which adds `--fully-async`. The mode comes from the program and the rollout
    function: a fully-async rollout function (slime's examples/fully_async, miles' FullyAsyncRolloutFn) or
    `--fully-async` streams; train_async.py runs one rollout ahead; train.py alternates."""
    converted = import_choices(CHOICES, source, out)
    rollout_function = str(source.get("rollout_function_path", ""))
    miles = source.framework.id == "miles"
    if source.get("fully_async") or "fully_async" in rollout_function or "FullyAsync" in rollout_function:
        why = source.cite("fully_async") if source.get("fully_async") else source.cite("rollout_function_path")
        out.set("mode", "fully_async", f"{why}: generation streams into a queue the trainer drains")
        if "max_weight_staleness" not in source.values:
            out.set("async.max_weight_staleness", None, "no --max-weight-staleness: no staleness filter"
                    if miles else "the fully-async rollout function has an unbounded queue and no version check")
        factor = source.get("async_data_buffer_capacity_factor")
        if isinstance(factor, (int, float)) and "rollout_batch_size" in source.values:
            groups = max(int(factor * source.get("rollout_batch_size")), 1)
            out.set("async.max_queue_size", groups, f"floor({source.cite('async_data_buffer_capacity_factor')} × "
                    f"{source.cite('rollout_batch_size')}) = {groups} groups")
        handler = source.get("async_unused_samples_handler")
        if handler in ("retry", "drop"):
            out.set("async.stale_policy", "regenerate" if handler == "retry" else "drop",
                    source.cite("async_unused_samples_handler"))
        if miles:
            mode = source.get("pause_generation_mode", "retract")
            out.set("async.partial_rollout", True, f"{source.cite('pause_generation_mode', 'retract')}: requests "
                    f"in flight at a weight update {'continue' if mode == 'retract' else 'resume'} under the new "
                    "weights")
    elif source.script.endswith("train_async.py"):
        out.set("mode", "async", f"{source.script} overlaps the next rollout with training (one step off)")
        if "async.max_weight_staleness" not in out.values:
            out.set("async.max_weight_staleness", 1, f"{source.script}: one rollout ahead")
    else:
        out.set("mode", "sync", f"{source.script or 'train.py'} trains each rollout before the next")
    if source.get("advantage_estimator", "grpo") not in ESTIMATOR.values:
        raise ImportFailure(f"not supported: {source.cite('advantage_estimator')} advantages (fasync has "
                            f"{source.framework.display}'s {', '.join(ESTIMATOR.values)})")
    if "advantage_estimator" not in source.values:
        out.set("train.advantage_estimator", "grpo", source.cite("advantage_estimator", "grpo"))
    if source.get("use_kl_loss"):
        out.set("train.kl_coef", source.get("kl_loss_coef", 0.0), f"use_kl_loss with {source.cite('kl_loss_coef', 0.0)}")
    _correction(source, out)
    if source.get("dynamic_sampling_filter_path"):
        out.set("rollout.dynamic_sampling", True, source.cite("dynamic_sampling_filter_path"))
    if source.get("calculate_per_token_loss"):
        out.set("train.loss_aggregation", "token_mean", source.cite("calculate_per_token_loss"))
    if source.get("use_wandb"):
        out.set_trackers({"wandb": source.cite("use_wandb")})
    _resources(source, out)
    _reward(source, out)
    if rollout_function and "fully_async" not in rollout_function and "FullyAsync" not in rollout_function and \
            not rollout_function.endswith(DEFAULT_ROLLOUT):
        out.need("rollout.function", f"{source.cite('rollout_function_path')} builds a whole rollout from the data "
                 "buffer; its per-sample generation is a rollout.function, async def f(task, engine) "
                 "(docs/agentic.md#custom-rollout-functions)")
    return converted | {
        "fully_async", "use_kl_loss", "kl_loss_coef", "use_tis", "use_wandb", "rollout_function_path",
        "pause_generation_mode", "dynamic_sampling_filter_path", "calculate_per_token_loss", "tis_level",
        "tis_upper_bound", "tis_lower_bound", "use_rs", "rs_level", "tis_batch_normalize", "use_rollout_logprobs",
        "actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus", "rollout_num_gpus_per_engine", "colocate",
        "async_unused_samples_handler", "rm_type", "rm_url", "async_data_buffer_capacity_factor"}


DEFAULT_ROLLOUT = "sglang_rollout.generate_rollout"
"""slime's (and miles') own rollout function, `--rollout-function-path`'s default."""
RM_TYPES = {"math": ("boxed_math", "the last \\boxed{} graded against the label"),
            "deepscaler": ("math_verify", "the final \\boxed{} answer graded as mathematics"),
            "dapo": ("math_verify", "the `Answer:` line graded as mathematics, 1 or -1: fasync scores 1 or 0, the "
                     "same advantages once each group is normalised by its std")}
"""slime's rule-based rewards (slime/rollout/rm_hub) → fasync's built-in nearest to each, and what it does."""


def _reward(source: Source, out: Imported) -> None:
    """--rm-type's rule-based rewards as fasync's built-ins, remote_rm (or --rm-url) as reward.url; a
    --custom-rm-path takes priority, as in slime (its signature differs: the table's row says how to adapt it)."""
    rm_type = str(source.get("rm_type", "")).strip()
    if source.get("custom_rm_path"):
        if rm_type:
            out.unmapped.append((source.written.get("rm_type", "rm_type"), rm_type,
                                 "unused: slime scores with --custom-rm-path instead"))
        return
    if rm_type == "remote_rm" or (not rm_type and source.get("rm_url")):
        if source.get("rm_url"):
            out.set("reward.url", str(source.get("rm_url")), f"{source.cite('rm_url')}: the server must answer "
                    "fasync's batches ({\"items\": [...]} → {\"rewards\": [...]}), not slime's one sample a request")
        else:
            out.need("reward.url", f"{source.cite('rm_type')} without --rm-url: set the reward server's URL")
        return
    builtin = RM_TYPES.get(rm_type.removeprefix("boxed_"))
    if not rm_type:
        return
    if builtin is None:
        out.need("reward.function", f"{source.cite('rm_type')}: no fasync built-in scores like it; a "
                 "module:function taking (completion, label) and returning a float does")
        return
    out.set("reward.function", builtin[0], f"{source.cite('rm_type')}: {builtin[1]}")


def _correction(source: Source, out: Imported) -> None:
    """--use-tis (token, or geometric: per sequence) with its caps, miles' --use-rs rejection, and the anchor:
    without --use-rollout-logprobs the PPO ratio is taken against logprobs the actor recomputes."""
    level = source.get("tis_level")
    if source.get("use_tis") or level:
        fasync_level = "sequence" if level in ("geometric", "sequence") else "token"
        out.set("correction.level", fasync_level, f"{source.cite('use_tis') if source.get('use_tis') else ''} "
                f"{source.cite('tis_level', 'token')}".strip())
        upper = source.get("tis_upper_bound", source.get("tis_clip", 2.0))
        out.set("correction.weight_upper", float(upper), source.cite("tis_upper_bound" if "tis_upper_bound" in
                                                                     source.values else "tis_clip", 2.0))
        if source.get("tis_batch_normalize"):
            out.set("correction.batch_normalize", True, source.cite("tis_batch_normalize"))
        if source.get("use_rs"):
            low = float(source.get("tis_lower_bound", source.get("tis_clip_low", 0.0)))
            key = "correction.reject_sequence_ratio" if source.get("rs_level") == "sequence" else \
                "correction.reject_token_ratio"
            out.set(key, [low, float(upper)], f"{source.cite('use_rs')}: ratios outside the tis bounds are rejected")
    elif not source.get("use_rollout_logprobs") and out.values.get("mode", ("sync",))[0] != "sync":
        out.set("correction.ratio_anchor", "recompute", f"{source.cite('use_rollout_logprobs', False)}: the PPO "
                "ratio is taken against logprobs the actor recomputes")


def _resources(source: Source, out: Imported) -> None:
    """The actor's GPUs (nodes × GPUs per node, one rank each) and the rollout's (`--rollout-num-gpus`, the
    actor's under --colocate), in engines of `--rollout-num-gpus-per-engine`."""
    nodes, per_node = source.get("actor_num_nodes", 1), source.get("actor_num_gpus_per_node", 8)
    colocate = bool(source.get("colocate"))
    trainer = nodes * per_node
    rollout = source.get("rollout_num_gpus", trainer if colocate else 0)
    per_engine = source.get("rollout_num_gpus_per_engine", 1)
    out.set("resources.trainer_ranks", trainer, f"{source.cite('actor_num_nodes', 1)} × "
            f"{source.cite('actor_num_gpus_per_node', 8)}")
    out.set("resources.gpus_per_trainer_rank", 1, "one GPU per actor rank")
    if rollout:
        out.set("resources.num_rollout_engines", max(rollout // per_engine, 1),
                f"{source.cite('rollout_num_gpus', rollout)} / {source.cite('rollout_num_gpus_per_engine', 1)}")
        out.set("resources.gpus_per_engine", per_engine, source.cite("rollout_num_gpus_per_engine", 1))
    out.set("resources.colocate", colocate, source.cite("colocate", False))
    out.set("rollout.engine", "vllm", f"{source.framework.display} generates with SGLang, which fasync does not "
            "have; vLLM is fasync's tensor-parallel server engine")
    total = trainer if colocate else trainer + rollout
    extra = source.get("eval_num_gpus", 0) if not colocate else 0
    out.set("resources.num_gpus", total + extra, f"{trainer} actor GPUs" + ("" if colocate else f" + {rollout} "
            "rollout GPUs") + (f" + {source.cite('eval_num_gpus')} (an eval engine fasync does not have)"
                               if extra else ""))
    out.set("resources.gpus_per_node", max(per_node, 8) if not colocate or nodes == 1 else per_node,
            "8-GPU nodes" if per_node < 8 else source.cite("actor_num_gpus_per_node", 8))


def express(cfg, derived) -> Expressed:
    out = express_flags(FRAMEWORK, cfg, derived)
    if cfg.mode == "fully_async":
        out.missing.append("mode fully_async: slime overlaps one rollout (train_async.py); miles streams")
    return out


def express_flags(framework: Framework, cfg, derived) -> Expressed:
    """What slime and miles write alike: every mode but fully_async."""
    prompts, n, per_step, steps, bound, interval = geometry(cfg, derived)
    script = {"sync": "train.py", "async": "train_async.py", "fully_async": "train_async.py"}[cfg.mode]
    out = Expressed(framework, f"python3 {script}")
    out.put("rollout-batch-size", prompts, "rollout.batch_size")
    out.put("n-samples-per-prompt", n, "rollout.n_samples_per_prompt")
    out.put("global-batch-size", per_step, "samples per optimizer step")
    out.put("num-steps-per-rollout", steps, "optimizer steps per rollout")
    out.put("num-rollout", cfg.train.num_rollouts, "train.num_rollouts")
    out.put("update-weights-interval", interval, "async.update_weights_interval")
    for choice, flag in zip(CHOICES, ("advantage-estimator", "lr-decay-style")):
        choice.express(cfg, out, flag)
    if cfg.train.lr_warmup_steps:
        out.put("lr-warmup-iters", cfg.train.lr_warmup_steps, "train.lr_warmup_steps")
    out.note_algorithm(cfg, ("train.advantage_estimator", "train.importance_ratio", "train.lr_warmup_steps",
                             "train.lr_schedule"))
    out.note_trimmed_samples(derived)
    if cfg.mode == "async" and bound != 1:
        out.missing.append(f"async.max_weight_staleness {bound}: {framework.display}'s train_async.py runs "
                           "exactly one rollout ahead")
    return out


REWARDS = ("`--rm-type` math is `reward.function: boxed_math`, deepscaler and dapo `math_verify` (dapo's -1 for a "
           "wrong answer is 0, the same advantages once each group is normalised by its std), `boxed_TYPE` as TYPE; "
           "`remote_rm` with `--rm-url` is `reward.url` (fasync posts batches: the server needs that route); f1, "
           "gpqa, ifbench and random ask for a `reward.function`. `--custom-rm-path` (`reward_func(args, sample)`) "
           "takes priority, as in slime, and asks for a `reward.function` of the fields it names; "
           "`--custom-generate-function-path` (`generate(args, sample, sampling_params)`) and a "
           "`--rollout-function-path` other than slime's own or a fully-async one ask for a `rollout.function`, "
           "`async def f(task, engine)`, each note saying how to port it.")


FRAMEWORK = Framework("slime", "slime", ROWS, import_into, express, rollout_checkpoint_keys=("save_interval",),
                      data_keys=("prompt_data",), reward_keys=("rm_type", "custom_rm_path", "rm_url"),
                      modes=MODES, defaults=DEFAULTS, rewards=REWARDS)
