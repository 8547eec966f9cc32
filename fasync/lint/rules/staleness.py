"""S: staleness and the async modes — how old the data a step trains on may be (docs/fully-async.md).

A weight version is one weight sync (every `async.update_weights_interval` rollouts or drains); a
sample's staleness is the trainer's version minus the oldest version that produced any of its
tokens. Lags are stated in optimizer steps, from `Derived.max_lag` (fasync/staleness.py): one version
spans interval × num_steps_per_rollout × ppo_epochs steps.
"""

from __future__ import annotations

from fasync.diagnostics import Severity
from fasync.lint.registry import DEFAULT, Finding, Fix, rule
from fasync.lint.rules.facts import plural, set_keys, uncorrected_partial_rollout, unit, worst_lag
from fasync.modes import ASYNC_MODES
from fasync.staleness import max_lag


@rule(
    "S001", "multi-step-staleness", Severity.WARNING,
    summary="Several optimizer steps per rollout in an async mode: the lag outgrows the staleness bound.",
    what="Reports, in async and fully_async, more than one optimizer step per rollout (fully_async: per drain), "
    "whether `train.num_steps_per_rollout` says so or it is derived (samples per rollout // "
    "`train.global_batch_size`). With `async.max_weight_staleness` set, the message gives the worst policy lag "
    "in optimizer steps, (staleness + 1) × `async.update_weights_interval` × steps × `train.ppo_epochs` − 1, "
    "next to the lag one "
    "step per rollout would give; with no bound the lag is unbounded, which is worse. The suggested fixes fit "
    "the mode (the dynamic global batch only where it is not redundant), and only fixes that leave no new "
    "warning are offered.",
    why="The staleness bound counts weight versions, and a version lasts as long as the trainer keeps the same "
    "weights on the engines: with N optimizer steps per rollout it spans N steps (times the sync interval). "
    "A bound of s versions then lets a trained token be up to (s + 1) × N − 1 optimizer steps older than the "
    "policy that takes its gradient, instead of s with one step per rollout: with s = 2 and N = 4, 11 steps, "
    "not 5. The data is that much more off-policy than the bound says, and than the off-policy correction "
    "was tuned for; without a bound nothing limits it at all. One optimizer step per drain keeps the bound "
    "honest. A deliberate choice is allowed: this is a warning, never an error.",
)
def multi_step_staleness(cfg, derived):
    bound, steps = cfg.async_.max_weight_staleness, derived.num_steps_per_rollout
    if cfg.mode not in ASYNC_MODES or steps <= 1:
        return
    per = unit(cfg.mode)
    explicit = cfg.train.num_steps_per_rollout is not None
    batch = derived.effective_global_batch_size
    source = "`train.num_steps_per_rollout`" if explicit else f"{derived.samples_per_rollout} samples / global batch {batch}"
    if bound is None:
        lag = (f"with no staleness bound (`async.max_weight_staleness` null) the policy lag is unbounded, and every "
               f"version spans {plural(derived.max_lag.steps_per_version, 'optimizer step')}")
    else:
        one_step = max_lag(cfg.mode, bound, 1, cfg.async_.update_weights_interval, cfg.train.ppo_epochs)
        lag = (f"under `async.max_weight_staleness` {bound} the worst policy lag is {worst_lag(cfg, derived)}, where "
               f"one step per {per} would give {one_step.steps_and_versions()}")
    yield Finding(
        "train.num_steps_per_rollout" if explicit else "train.global_batch_size",
        f"{steps} optimizer steps per {per} ({source}): {lag}; the later steps train on data staler than the "
        "bound says",
        f"make each {per} one optimizer step: `train.global_batch_size` = samples per {per} "
        f"({derived.samples_per_rollout}), or `rollout.batch_size` = global batch / `rollout.n_samples_per_prompt`",
        fixes=_one_step_fixes(cfg, derived),
    )


def _one_step_fixes(cfg, derived) -> tuple[Fix, ...]:
    """One optimizer step per rollout (drain), each way that fits the mode; the engine keeps those that add no
    warning."""
    per, n = unit(cfg.mode), cfg.rollout.n_samples_per_prompt
    batch, samples = derived.effective_global_batch_size, derived.samples_per_rollout
    written = set_keys(cfg)
    steps_default = (("train.num_steps_per_rollout", DEFAULT),) if "train.num_steps_per_rollout" in written else ()
    fixes = []
    if batch % n == 0:
        fixes.append(Fix((("rollout.batch_size", batch // n),) + steps_default,
                         f"= global batch {batch} / {n} samples per prompt: each {per} is one step of the same "
                         f"{batch} samples"))
    fixes.append(Fix((("train.global_batch_size", samples),) + steps_default,
                     f"= samples per {per}: the whole {per} is one step"))
    if cfg.mode != "fully_async":  # in fully_async the drain size is fixed: the dynamic batch is redundant (S002)
        unset = tuple((key, DEFAULT) for key in ("train.global_batch_size", "train.num_steps_per_rollout")
                      if key in written)
        fixes.append(Fix((("train.use_dynamic_global_batch_size", True),) + unset,
                         "every rollout is one step, whatever its size"))
    return tuple(fixes)


@rule(
    "S002", "dynamic-batch-redundant", Severity.INFO,
    summary="`train.use_dynamic_global_batch_size` is redundant in fully_async.",
    what="Reports `train.use_dynamic_global_batch_size: true` in fully_async.",
    why="A fully_async drain always takes exactly `rollout.batch_size` groups, so its size is fixed and "
    "known: the dynamic global batch only pins `train.num_steps_per_rollout` to 1. Setting "
    "`train.global_batch_size` to the samples per drain says the same thing in the key that "
    "`fasync config show` and the other modes read.",
)
def dynamic_batch_redundant(cfg, derived):
    if cfg.mode == "fully_async" and cfg.train.use_dynamic_global_batch_size:
        yield Finding(
            "train.use_dynamic_global_batch_size",
            f"`train.use_dynamic_global_batch_size` is redundant in fully_async: every drain takes exactly "
            f"`rollout.batch_size` {cfg.rollout.batch_size} groups ({derived.samples_per_rollout} samples), so it "
            "only pins `train.num_steps_per_rollout` to 1",
            f"remove it and set `train.global_batch_size: {derived.samples_per_rollout}`: one optimizer step per "
            "drain, said where every mode reads it",
        )


@rule(
    "S003", "unbounded-staleness", Severity.WARNING,
    summary="fully_async without a staleness bound.",
    what="Reports `async.max_weight_staleness: null` in fully_async.",
    why="With no bound, the rollouter admits groups regardless of the version they will be trained at and no "
    "group is ever dropped as stale: how old a trained sample can be depends only on the queue size, the "
    "concurrency limit and how long generations take, and grows when the trainer is slow. Off-policy "
    "correction degrades as the lag grows, and nothing in the config says how far that is.",
)
def unbounded_staleness(cfg, derived):
    if cfg.mode == "fully_async" and cfg.async_.max_weight_staleness is None:
        queue, batch = derived.max_queue_size, cfg.rollout.batch_size
        yield Finding(
            "async.max_weight_staleness",
            f"`async.max_weight_staleness` is null: no group is ever too stale to train on; only the queue "
            f"({queue} groups, {queue / batch:g} drains) and `async.max_concurrent_samples` limit how far the "
            "rollouter runs ahead",
            "set `async.max_weight_staleness` to the most versions a sample may lag behind the trainer (e.g. 1 or 2)",
        )


@rule(
    "S004", "zero-staleness", Severity.INFO,
    summary="`async.max_weight_staleness: 0` in an async mode behaves like sync.",
    what="Reports `async.max_weight_staleness: 0` with `async.update_weights_interval: 1` in async or "
    "fully_async.",
    why="With a bound of 0, a rollout (or a group) may be generated only with the weights it will be trained "
    "at, i.e. after the previous training step's weights were synced: generation and training take turns, "
    "exactly as in sync mode, while paying for the async machinery (threads, the queue, version checks).",
)
def zero_staleness(cfg, derived):
    if cfg.mode in ASYNC_MODES and cfg.async_.max_weight_staleness == 0 and cfg.async_.update_weights_interval == 1:
        waits = ("the rollouter admits a group only for the drain at the current weight version" if
                 cfg.mode == "fully_async" else "rollout r + 1 may start only with the weights trained on rollout r")
        yield Finding(
            "async.max_weight_staleness",
            f"`async.max_weight_staleness` 0 in {cfg.mode}: {waits}, so generation and training take turns as in sync",
            "use `mode: sync` for the same semantics with less machinery, or `async.max_weight_staleness: 1` to "
            "overlap generation with training",
        )


@rule(
    "S005", "partial-rollout-uncorrected", Severity.WARNING,
    summary="Partial rollouts without off-policy correction.",
    what="Reports fully_async with `async.partial_rollout: true`, `correction.level: none`, no rejection mask "
    "(`correction.reject_token_ratio`, `reject_sequence_ratio`, `reject_kl`) and a PPO ratio anchored elsewhere "
    "than the behaviour logprobs (`correction.ratio_anchor` proximal or recompute).",
    why="A partial rollout is aborted at a weight sync and resumed from its prefix under the new weights, so "
    "one sample holds tokens of several policy versions. Only a per-token importance weight (or a PPO ratio "
    "taken against the rollout logprobs themselves) accounts for which policy sampled which token, or a "
    "rejection mask that drops the tokens (or sequences) whose ratio strays too far, as verl's rejection "
    "mode does; without any of these the older tokens are trained on as if the current policy had sampled them.",
)
def partial_rollout_uncorrected(cfg, derived):
    if uncorrected_partial_rollout(cfg, derived):
        yield Finding(
            "async.partial_rollout",
            "`async.partial_rollout` resumes aborted generations under new weights, so a sample's tokens come "
            f"from several policy versions, but `correction.level` is none, no rejection mask is set and the PPO "
            f"ratio is anchored at the {derived.ratio_anchor} policy: nothing weighs or masks the older tokens by "
            "π_train/π_behav",
            "set `correction.level: token` (one weight per token, whichever version sampled it), "
            "`correction.ratio_anchor: behaviour`, or a rejection mask (`correction.reject_token_ratio: [0.5, 2.0]`)",
        )


def _never_synced(cfg) -> bool:
    rollouts = cfg.train.num_rollouts
    return cfg.mode in ASYNC_MODES and rollouts > 1 and cfg.async_.update_weights_interval >= rollouts


@rule(
    "S006", "weights-never-synced", Severity.ERROR,
    summary="`async.update_weights_interval` is so long that trained weights never reach the engines.",
    what="Reports, in async and fully_async, an `async.update_weights_interval` of at least "
    "`train.num_rollouts` (for a run of more than one rollout).",
    why="Weights are pushed to the engines once every interval rollouts (drains). With an interval as long "
    "as the run, the push happens after the last one or never, so every sample of the run is generated by "
    "the initial policy: the run is offline training on the initial policy's samples. The staleness metrics "
    "read 0 throughout, because they count weight syncs, and there are none.",
)
def weights_never_synced(cfg, derived):
    if _never_synced(cfg):
        interval, rollouts = cfg.async_.update_weights_interval, cfg.train.num_rollouts
        per = unit(cfg.mode)
        yield Finding(
            "async.update_weights_interval",
            f"`async.update_weights_interval` {interval} ≥ `train.num_rollouts` {rollouts}: trained weights reach "
            f"the engines only after the last {per}, if at all, so every sample comes from the initial policy",
            f"set `async.update_weights_interval` well below {rollouts} (1: a sync after every {per})",
        )


@rule(
    "S007", "sync-interval-hides-lag", Severity.WARNING,
    summary="`async.update_weights_interval` > 1: the staleness bound counts syncs, not optimizer steps.",
    what="Reports, in async and fully_async with `async.max_weight_staleness` set, an "
    "`async.update_weights_interval` above 1. The message gives how many optimizer steps one version spans "
    "and the worst policy lag in optimizer steps: (staleness + 1) × interval × steps per rollout × "
    "`train.ppo_epochs` − 1.",
    why="A weight version advances once per sync. With an interval of k, the trainer takes k × "
    "num_steps_per_rollout optimizer steps per version, and staleness (like the `staleness_max` metric) does "
    "not see the steps between syncs: even a staleness of 0 is then off-policy by up to k × steps × epochs − 1 "
    "updates. The bound no longer says how off-policy the data is.",
)
def sync_interval_hides_lag(cfg, derived):
    bound, interval = cfg.async_.max_weight_staleness, cfg.async_.update_weights_interval
    if cfg.mode not in ASYNC_MODES or bound is None or interval == 1 or _never_synced(cfg):
        return
    per_version = derived.max_lag.steps_per_version
    yield Finding(
        "async.update_weights_interval",
        f"`async.update_weights_interval` {interval}: weights reach the engines every {interval} {unit(cfg.mode)}s "
        f"({plural(per_version, 'optimizer step')}) and staleness counts syncs, not steps: within "
        f"`async.max_weight_staleness` {bound} the worst policy lag is {worst_lag(cfg, derived)}",
        "set `async.update_weights_interval: 1`, or choose `async.max_weight_staleness` knowing that one version "
        f"is {plural(per_version, 'optimizer step')}",
    )


@rule(
    "S009", "epochs-stretch-staleness", Severity.WARNING,
    summary="Several PPO epochs in an async mode: each pass adds its optimizer steps to the lag.",
    what="Reports, in async and fully_async with `async.max_weight_staleness` set, `train.ppo_epochs` above 1. "
    "The message gives the worst policy lag in optimizer steps, (staleness + 1) × interval × steps per "
    "rollout × epochs − 1, next to the lag one epoch would give.",
    why="Every epoch passes over the same rollout again with its own optimizer steps, and the weights reach the "
    "engines only after the last one: one version spans epochs times as many optimizer steps, and a sample "
    "admitted at the bound's limit is trained on by policies that many steps further from the one that "
    "sampled it. The staleness bound, and the `staleness_max` metric, count versions and do not see it. "
    "Several epochs trade sample reuse for off-policyness; that trade is fine in sync (PPO's own), but in the "
    "async modes it stacks on the staleness the bound allows.",
)
def epochs_stretch_staleness(cfg, derived):
    bound, epochs = cfg.async_.max_weight_staleness, cfg.train.ppo_epochs
    if cfg.mode not in ASYNC_MODES or bound is None or epochs == 1 or _never_synced(cfg):
        return
    one_epoch = max_lag(cfg.mode, bound, derived.num_steps_per_rollout, cfg.async_.update_weights_interval)
    yield Finding(
        "train.ppo_epochs",
        f"`train.ppo_epochs` {epochs}: each {unit(cfg.mode)} takes {plural(derived.optimizer_steps_per_rollout, 'optimizer step')}, "
        f"so within `async.max_weight_staleness` {bound} the worst policy lag is {worst_lag(cfg, derived)}, "
        f"against {one_epoch.steps_and_versions()} with one epoch",
        f"set `train.ppo_epochs: 1`, or lower `async.max_weight_staleness` knowing that one version is "
        f"{plural(derived.max_lag.steps_per_version, 'optimizer step')}",
    )


@rule(
    "S008", "sliced-completions-outlive-bound", Severity.WARNING,
    summary="Sliced calls so short that the longest completions outlive the staleness bound.",
    what="Reports fully_async with partial rollout, `async.tokens_per_call` and `async.max_weight_staleness` "
    "set, where a completion of `rollout.max_new_tokens` takes more engine calls (max_new_tokens / "
    "tokens_per_call, rounded up) than the bound allows versions, unless `async.stale_policy` is `wait`.",
    why="A weight sync can fall between any two calls, and a finished group may wait in the queue through one "
    "more: a completion that takes m calls can reach staleness m before it is trained on. Beyond the bound "
    "its group is dropped (or regenerated, and may outlive the bound again), and the groups this hits are "
    "the ones with the longest completions, so training sees fewer long answers than the data holds: a "
    "length bias no metric but `dropped_stale` shows. Longer slices, or a bound of m, keep every completion "
    "within reach; `async.stale_policy: wait` makes the drain a late completion would miss wait for it.",
)
def sliced_completions_outlive_bound(cfg, derived):
    bound, per_call, longest = cfg.async_.max_weight_staleness, derived.tokens_per_call, cfg.rollout.max_new_tokens
    if per_call is None or bound is None or cfg.async_.stale_policy == "wait":
        return
    calls = -(-longest // per_call)
    if calls <= bound:
        return
    fate = "regenerated" if cfg.async_.stale_policy == "regenerate" else "dropped"
    raise_bound = f"`async.max_weight_staleness: {calls}`"
    raised = max_lag(cfg.mode, calls, derived.num_steps_per_rollout, cfg.async_.update_weights_interval,
                     cfg.train.ppo_epochs)
    raise_bound += f" (a worst policy lag of {raised.steps_and_versions()}, against {derived.max_lag.steps_and_versions()} now)"
    fix = (f"set `async.tokens_per_call: {-(-longest // bound)}` or more (at most {bound} calls per completion), "
           f"or {raise_bound}" if bound > 0 else f"set {raise_bound}")
    fix += ", or `async.stale_policy: wait` (a drain then waits for the completions that would miss it)"
    yield Finding(
        "async.tokens_per_call",
        f"a completion of `rollout.max_new_tokens` {longest} takes {plural(calls, 'call')} of "
        f"`async.tokens_per_call` {per_call}: with a weight sync between calls and one while it "
        f"waits in the queue it reaches staleness {calls}, beyond `async.max_weight_staleness` {bound}, and is "
        f"{fate}. The longest completions are the ones this hits, so training sees fewer long answers than the "
        "data holds",
        fix,
    )


@rule(
    "S010", "streamed-stale-drops-favour-short", Severity.INFO,
    summary="Streamed requests with partial rollout drop mostly long completions as stale.",
    what="Reports fully_async with the vLLM engine's streamed requests, partial rollout and a staleness bound, "
    "where `async.stale_policy` is not `wait`.",
    why="Admission runs as far ahead as the bound allows, so a group is often admitted for a drain at the bound's "
    "edge. A group whose completions are longer than its neighbours' is still generating when that drain is taken, "
    "goes into the next one, one version past the bound, and is dropped (or regenerated, and may miss again). The "
    "groups this hits are the long ones: on the vLLM long tail of docs/benchmarks.md nearly every long group was "
    "dropped, and the trained completions drifted short of the data's lengths. Only `dropped_stale` and the "
    "completion lengths show it. `async.stale_policy: wait` makes such a drain wait for the group.",
)
def streamed_stale_drops_favour_short(cfg, derived):
    if not derived.streams_requests or not cfg.async_.partial_rollout or cfg.async_.max_weight_staleness is None:
        return
    if cfg.async_.stale_policy == "wait":
        return
    fate = "regenerated" if cfg.async_.stale_policy == "regenerate" else "dropped"
    yield Finding(
        "async.stale_policy",
        f"`async.stale_policy` {cfg.async_.stale_policy} with streamed requests and partial rollout: a group "
        "admitted at the edge of `async.max_weight_staleness` that finishes after its drain is taken goes one "
        f"version past the bound and is {fate}. These are the groups with the longest completions, so training "
        "sees fewer long answers than the data holds (watch `dropped_stale` beside the completion lengths)",
        "set `async.stale_policy: wait`: a drain then waits for the groups still generating that the next one "
        "would drop, and the engines keep generating meanwhile",
    )
