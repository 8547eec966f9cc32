"""AReaL (inclusionAI/AReaL): always streams; a YAML config."""

from __future__ import annotations

import re

from fasync.frameworks.common import (
    CONVERTED,
    NESTED,
    NONE,
    SAME,
    Expressed,
    Framework,
    Imported,
    ImportFailure,
    Source,
    geometry,
)

ROWS = [
    ("train_dataset.batch_size", "rollout.batch_size", SAME, "prompts per training step: a fasync drain."),
    ("train_dataset.path", "data.path", SAME, "a JSONL file of prompt/label objects in fasync."),
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
    ("actor.kl_ctl", (), NONE, "AReaL folds kl_ctl × (old − reference logprobs) into the per-token reward; "
     "fasync's train.kl_coef is a loss term, another objective: no equivalent."),
    ("actor.reward_norm.std_level", "train.normalize_advantage_std", CONVERTED,
     "null: the group baseline without dividing by the std (normalize_advantage_std false)."),
    ("actor.reward_norm.mean_leave1out", "train.advantage_estimator", CONVERTED,
     "true: the mean of the group's other samples is each sample's baseline, fasync's rloo."),
    ("actor.adv_norm.*", (), NONE, "AReaL normalizes the advantages a second time, over the batch (its mean_level "
     "and std_level batch); fasync's are normalized within the group only (train.normalize_advantage_std): no "
     "equivalent."),
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
    ("rollout.backend", ("resources.num_rollout_engines", "resources.gpus_per_engine"), CONVERTED,
     "the newer per-engine layout, e.g. sglang:d4p1t1: allocation_mode's engine part."),
    ("actor.backend", "resources.trainer_ranks", CONVERTED,
     "the newer per-engine layout, e.g. fsdp:d4p1t1: allocation_mode's trainer part."),
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
    """AReaL streams, except colocated (`|` in allocation_mode), where generation and training take turns."""
    if source.get("critic.is_critic"):
        raise ImportFailure(f"not supported: a critic ({source.cite('critic.is_critic')}): PPO with a value model, "
                            "which fasync does not have")
    colocated_engine = source.get("rollout.scheduling_strategy.type") == "colocation"
    colocated = "|" in str(source.get("allocation_mode", "")) or bool(source.get("actor.colocated")) \
        or colocated_engine
    if colocated:
        why = source.cite("rollout.scheduling_strategy.type" if colocated_engine else "allocation_mode")
        out.set("mode", "sync", f"{why}: colocated, generation and training take turns")
        out.set("async.max_weight_staleness", None, "colocated: on-policy")
    else:
        out.set("mode", "fully_async", "AReaL streams rollouts and syncs weights after every step")
    if "actor.reward_norm.std_level" in source.values and source.get("actor.reward_norm.std_level") is None:
        out.set("train.normalize_advantage_std", False, f"{source.cite('actor.reward_norm.std_level')}: the group "
                "mean is subtracted, the std not divided")
    if source.get("actor.reward_norm.mean_leave1out"):
        out.set("train.advantage_estimator", "rloo", f"{source.cite('actor.reward_norm.mean_leave1out')}: the "
                "leave-one-out group baseline")
    _resources(source, out, colocated)
    decoupled = source.get("actor.use_decoupled_loss")
    if decoupled:
        out.set("correction.ratio_anchor", "proximal", f"{source.cite('actor.use_decoupled_loss')}: decoupled PPO")
        out.set("correction.level", "token", "decoupled PPO's behaviour importance weight")
        if "actor.behav_imp_weight_cap" in source.values:
            out.set("correction.weight_upper", float(source.get("actor.behav_imp_weight_cap")),
                    source.cite("actor.behav_imp_weight_cap"))
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
        if "actor.behav_imp_weight_cap" not in source.values:
            out.set("correction.weight_upper", float(upper), f"{source.cite('actor.rejection_sampling.upper')}: "
                    "AReaL masks above it and leaves the weights below as they are, not truncated at fasync's 2.0")
    trackers = {}
    wandb_mode = source.get("stats_logger.wandb.mode")
    if wandb_mode in ("online", "offline"):
        trackers["wandb"] = source.cite("stats_logger.wandb.mode")
        out.set("logging.wandb_mode", wandb_mode, source.cite("stats_logger.wandb.mode"))
    if source.get("stats_logger.tensorboard.path"):
        trackers["tensorboard"] = source.cite("stats_logger.tensorboard.path")
    out.set_trackers(trackers)
    out.need("reward.function", "AReaL's reward is the reward_fn its Python entry point gives the workflow, which the "
             "YAML does not name (examples/math's gsm8k_reward_fn grades with math_verify: fasync's math_verify); a "
             "custom workflow's arun_episode is a rollout.function, async def f(task, engine) (docs/agentic.md)")
    return {"actor.use_decoupled_loss", "actor.recompute_logprob", "rollout.max_concurrent_rollouts",
            "allocation_mode", "rollout.backend", "actor.backend", "rollout.scheduling_strategy.type",
            "cluster.n_nodes", "cluster.n_gpus_per_node", "actor.reward_norm.std_level",
            "actor.reward_norm.mean_leave1out",
            *(("rollout.max_head_offpolicyness",) if colocated else ()),
            "actor.rejection_sampling.upper", "stats_logger.wandb.mode", "stats_logger.tensorboard.path"}


def _resources(source: Source, out: Imported, colocated: bool) -> None:
    """allocation_mode `engine:dDpPtT+trainer:dN` (`|` colocated), or the newer per-engine `rollout.backend`
    `engine:dDpPtT` and `actor.backend` `trainer:dN`: D engines of P × T GPUs, N trainer ranks; the cluster's
    GPUs from cluster.n_nodes × n_gpus_per_node."""
    parts = [part for part in re.split(r"[+|]", str(source.get("allocation_mode", ""))) if part]
    engine_key = "allocation_mode" if parts else "rollout.backend"
    trainer_key = "allocation_mode" if len(parts) > 1 else "actor.backend"
    engine_part = parts[0] if parts else source.get("rollout.backend")
    trainer_part = parts[1] if len(parts) > 1 else source.get("actor.backend")
    if engine_part:
        engine, _, layout = str(engine_part).rpartition(":")
        degrees = dict(re.findall(r"([dpt])(\d+)", layout))
        engines, per_engine = int(degrees.get("d", 1)), int(degrees.get("p", 1)) * int(degrees.get("t", 1))
        out.set("resources.num_rollout_engines", engines, f"{source.cite(engine_key)}: d{engines}")
        out.set("resources.gpus_per_engine", per_engine, f"{source.cite(engine_key)}: p × t")
        name = engine.split("[")[0]
        out.set("rollout.engine", "vllm", source.cite(engine_key) + (
            "" if name == "vllm" else f": {name or 'SGLang'}, which fasync does not have; vLLM is fasync's "
            "tensor-parallel server engine"))
    trainer = dict(re.findall(r"([dpt])(\d+)", str(trainer_part).rpartition(":")[2])) if trainer_part else {}
    if trainer:
        out.set("resources.trainer_ranks", int(trainer.get("d", 1)), f"{source.cite(trainer_key)}: the "
                "trainer's data-parallel degree")
        out.set("resources.gpus_per_trainer_rank", 1, "one GPU per trainer rank")
    out.set("resources.colocate", colocated, source.cite(
        "rollout.scheduling_strategy.type" if "rollout.scheduling_strategy.type" in source.values else engine_key))
    if "cluster.n_gpus_per_node" in source.values:
        nodes, per_node = source.get("cluster.n_nodes", 1), source.get("cluster.n_gpus_per_node")
        out.set("resources.num_gpus", nodes * per_node, f"{source.cite('cluster.n_nodes', 1)} × "
                f"{source.cite('cluster.n_gpus_per_node')}")
        out.set("resources.gpus_per_node", per_node, source.cite("cluster.n_gpus_per_node"))


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


FRAMEWORK = Framework("areal", "AReaL", ROWS, import_into, express, rollout_checkpoint_keys=("saver.freq_steps",),
                      data_keys=("train_dataset.path",), reward_keys=("the reward function of its Python entry point",),
                      rewards=("The reward is the `reward_fn` the Python entry point gives its workflow, which the "
                               "YAML does not name: the import asks for a `reward.function` (`math_verify` for "
                               "examples/math's gsm8k_reward_fn, which grades with math-verify). A custom workflow's "
                               "`arun_episode(engine, data)` is a `rollout.function`, `async def f(task, engine)`."),
                      modes=("AReaL streams: `fully_async` with `rollout.max_head_offpolicyness` as the bound, except "
                             "a colocated allocation (`|` in `allocation_mode`, `actor.colocated`, or "
                             "`rollout.scheduling_strategy.type: colocation`), where "
                             "generation and training take turns: `sync`."),
                      defaults=("`allocation_mode` `engine:dDpPtT+trainer:dN` (or the newer `rollout.backend` "
                                "`engine:dDpPtT` with `actor.backend` `trainer:dN`) gives D engines of P × T GPUs "
                                "and N trainer ranks; SGLang becomes vLLM, fasync's tensor-parallel engine; "
                                "`cluster.n_nodes` × `n_gpus_per_node` GPUs; `reward_norm.std_level: null` is "
                                "`train.normalize_advantage_std: false`; a critic (`critic.is_critic`) is refused as "
                                "not supported; `kl_ctl` is a reward penalty with no equivalent."))
