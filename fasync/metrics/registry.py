"""Every metric a `metrics.jsonl` row may hold, defined once: name, unit, meaning, the modes that write it,
and how a whole run sums it up.

One row is one optimizer step. The writer refuses a key that is not registered here (or not registered
for the run's mode), docs/metrics.md is generated from this table, and readers (the run summary,
`fasync bench`, trackers and reports) combine rows with `Metric.over` instead of reading keys by hand.

`scope` says what a value describes: `step` values belong to their own row (sum them over rows); `rollout`
values describe the whole rollout (fully_async: drain) and repeat on each of its rows, so a reader takes
one row per rollout.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Optional

from fasync.metrics.agentic import TOOL_ERROR_KINDS
from fasync.metrics.ledger import DROPPED_FROM
from fasync.metrics.signal import ENTROPY_FLOOR, STREAK_STEPS
from fasync.modes import ASYNC_MODES, MODES

ALL: frozenset[str] = frozenset(MODES)
ASYNC: frozenset[str] = frozenset(ASYNC_MODES)
FULLY_ASYNC: frozenset[str] = frozenset({"fully_async"})
Over = Literal["sum", "max", "mean", "last"]


class UnregisteredMetric(KeyError):
    """A row holds a key the registry does not define for the run's mode."""


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    """"optimizer steps", "versions", "samples", "tokens", "groups", "s", "samples/s", "fraction", "nats/token",
    "1" (a pure number), "index", "bool", "text"."""
    meaning: str
    modes: frozenset[str] = ALL
    """Modes that write it."""
    when: Optional[str] = None
    """A condition on the config under which it is written at all; None: on every row of those modes."""
    scope: Literal["step", "rollout"] = "step"
    over: Optional[Over] = None
    """How a run sums it up (`Metric.over`); None: it has no run-wide figure."""

    @property
    def numeric(self) -> bool:
        return self.unit not in ("text", "bool")

    def values(self, rows: Iterable[dict]) -> list:
        """The metric's values in `rows`, one per rollout when its scope is the rollout, skipping rows (and
        values) without it."""
        rows = list(rows)
        if self.scope == "rollout":
            rows = list({row["rollout"]: row for row in rows}.values())
        return [row[self.name] for row in rows if row.get(self.name) is not None]

    def over_rows(self, rows: Iterable[dict]) -> Optional[float]:
        """The run-wide figure of `rows` (`over`): a sum is 0 and anything else None when no row has it."""
        values = self.values(rows)
        if self.over == "sum":
            return sum(values)
        if not values:
            return None
        if self.over == "max":
            return max(values)
        if self.over == "mean":
            return sum(values) / len(values)
        if self.over == "last":
            return values[-1]
        raise ValueError(f"{self.name} has no run-wide figure")


def _metrics(*metrics: Metric) -> dict[str, Metric]:
    return {metric.name: metric for metric in metrics}


_CORRECTION = (
    ("kl_direct", "nats/token", "mean of log π_behav − log π_train over the step's tokens (a direct KL estimate)"),
    ("kl_k3", "nats/token", "k3 estimate of KL(π_behav ‖ π_train) over the step's tokens"),
    ("ppl_train", "1", "perplexity of the completions under the training policy"),
    ("ppl_rollout", "1", "perplexity of the completions under the behaviour policy"),
    ("log_ppl_diff", "nats/token", "mean over sequences of log π_behav − log π_train per token"),
    ("chi2_token", "1", "χ² divergence of the token importance weights: E[w²] − 1"),
    ("chi2_seq", "1", "χ² divergence of the sequence importance weights"),
    ("ess_token", "fraction", "normalised effective sample size of the token weights, (Σw)² / (n Σw²)"),
    ("ess_seq", "fraction", "normalised effective sample size of the sequence weights"),
    ("weight_mean", "1", "mean importance weight applied, over kept tokens"),
    ("weight_max", "1", "largest importance weight applied (the maximum over micro batches and ranks)"),
    ("truncated_token_frac", "fraction", "tokens whose weight was truncated to [weight_lower, weight_upper]"),
    ("truncated_seq_frac", "fraction", "sequences with at least one truncated token"),
    ("rejected_token_frac", "fraction", "tokens masked out by the rejection rules"),
    ("rejected_seq_frac", "fraction", "sequences with every token rejected"),
    ("all_rejected", "1", "1 when every token of the step was rejected (no optimizer step), else 0"),
)

_DROPS = {
    "zero_variance": ("prompt groups whose completions all got the same reward (dynamic sampling)", ALL,
                      "`rollout.dynamic_sampling`"),
    "surplus": ("groups dynamic sampling generated beyond `rollout.batch_size`", frozenset({"sync", "async"}),
                None),
    "unfinished_at_stop": ("groups still generating when the rollouter stopped", FULLY_ASYNC,
                           "such a drop before the last drain"),
    "stale": ("groups beyond `async.max_weight_staleness` at the version their drain trains at", FULLY_ASYNC, None),
    "stale_at_resume": ("groups in flight at a checkpoint whose prefix was already beyond "
                        "`async.max_weight_staleness` when the run resumed", FULLY_ASYNC, "a resume"),
    "reward_failed": ("groups with a completion the reward could not score (it raised, timed out or returned no "
                      "finite number)", ALL, "`reward.on_error: drop`"),
}
assert set(_DROPS) | {"trimmed"} == set(DROPPED_FROM)  # trimmed samples are counted in the ledger only

_AGENTIC = "`rollout.function` or `rollout.env`"
_AGENT = (
    ("turns_mean", "1", "mean model turns per trajectory", "mean"),
    ("turns_max", "1", "most model turns in one trajectory", "max"),
    ("tool_calls", "1", "tool calls the trajectories made", "sum"),
    ("tool_errors", "1", "tool calls that failed, of every kind (`agent/tool_errors_<kind>`)", "sum"),
    ("tool_time_s", "s", "seconds spent in tool calls, summed over calls", "sum"),
    ("env_time_s", "s", "seconds spent in the environment's reset and step, summed over trajectories", "sum"),
    ("masked_token_fraction", "fraction", "tokens after the prompt that the loss does not train on (observations)",
     "mean"),
    ("truncated", "1", "trajectories that ran out of turns or tokens before the environment was done", "sum"),
    ("version_span_mean", "versions", "mean newest − oldest weight version among a trajectory's trained tokens",
     "mean"),
    ("version_span_max", "versions", "largest newest − oldest weight version among one trajectory's trained tokens",
     "max"),
    ("multi_version_fraction", "fraction", "trajectories whose trained tokens come from more than one version",
     "mean"),
)
_EVALUATES = "`eval.every` or `eval.before_train`"
_EVAL_FIGURES = (
    ("prompts", "1", "eval prompts evaluated"),
    ("reward_mean", "1", "mean reward of the eval completions (each prompt has `eval.samples_per_prompt`)"),
    ("mean@k", "fraction", "mean over the eval prompts of the share of their completions that are correct (reward "
     "at least `eval.correct_reward`): pass@1 averaged over the samples"),
    ("pass@k", "fraction", "unbiased pass@k (k: `eval.pass_k`) from n = `eval.samples_per_prompt` completions with "
     "c correct, 1 − C(n−c, k) / C(n, k), averaged over the eval prompts"),
)
PER_SOURCE = "<data_source>"
"""The placeholder in the names of the per-`data_source` eval metrics: `eval/<data_source>/pass@k` stands for
`eval/gsm8k/pass@k` and every other source's key (`metric_for`)."""

METRICS: dict[str, Metric] = _metrics(
    # Where the row sits.
    Metric("step", "index", "optimizer step, from 0 (a skipped step counts too)", over="max"),
    Metric("rollout", "index", "rollout (fully_async: drain) the step trained on, from 0", over="max"),
    Metric("epoch", "index", "the pass over its rollout (drain) this step belongs to, from 0",
           when="`train.ppo_epochs` above 1", over="max"),
    Metric("weight_version", "versions", "the trainer's weight version for this step", over="last"),
    Metric("wall_time", "s", "seconds since the metrics file was opened, when the row was written", over="max"),
    # The optimizer step (the trainer).
    Metric("loss", "1", "the step's total loss: policy gradient + kl_coef × kl − entropy_coef × entropy"),
    Metric("pg_loss", "1", "the clipped policy-gradient surrogate, aggregated as `train.loss_aggregation`"),
    Metric("kl", "nats/token", "k3 KL to the reference policy (0 without `train.kl_coef`)"),
    Metric("entropy", "nats/token", "mean entropy of the policy over the step's tokens"),
    Metric("clip_fraction", "fraction", "kept tokens where the PPO clip was active"),
    Metric("grad_norm", "1", "global gradient norm before clipping (0 for a skipped step)"),
    Metric("lr", "1", "learning rate"),
    Metric("num_samples", "samples", "samples trained in this step", over="sum"),
    Metric("num_tokens", "tokens", "completion tokens trained in this step (all ranks)", over="sum"),
    Metric("reward_mean", "1", "mean reward of the step's samples", over="last"),
    Metric("advantage_abs_mean", "1", "mean absolute advantage of the step's samples"),
    Metric("response_length_mean", "tokens", "mean completion length of the step's samples", over="mean"),
    Metric("response_truncated_fraction", "fraction", "the step's samples cut off by `rollout.max_new_tokens` "
           "(finish reason `length`; verl's `response_length/clip_ratio`), which overlong shaping drives down",
           over="mean"),
    Metric("skipped", "bool", "the step took no optimizer step"),
    Metric("zero_advantage_streak", "optimizer steps", "optimizer steps in a row, up to this one, whose every "
           f"advantage was 0; the run warns at {STREAK_STEPS} (fasync/metrics/signal.py)", over="max"),
    Metric("entropy_collapse_streak", "optimizer steps", "optimizer steps in a row, up to this one, whose entropy "
           f"was at most {ENTROPY_FLOOR:g} nats/token; the run warns at {STREAK_STEPS} (fasync/metrics/signal.py)",
           over="max"),
    Metric("skip_reason", "text", "why (null unless skipped): every token rejected by correction, or a NaN or "
           "inf loss or gradient"),
    Metric("nonfinite_skipped", "1", "1 when the step was skipped for a NaN or inf loss or gradient, else 0; "
           "`train.max_bad_steps` such steps in a row fail the run", over="sum"),
    *(Metric(f"is/{name}", unit, meaning + " ([correction.md](correction.md))", over="last")
      for name, unit, meaning in _CORRECTION),
    # Freshness.
    Metric("staleness_mean", "versions", "mean staleness of the step's samples: trainer version − the oldest "
           "version that produced a token", over="mean"),
    Metric("staleness_max", "versions", "largest staleness among the step's samples", over="max"),
    Metric("policy_lag_max", "optimizer steps", "the most optimizer steps between the weights that sampled one of "
           "the step's samples and this step: at most `(max_weight_staleness + 1) × update_weights_interval × "
           "num_steps_per_rollout × ppo_epochs − 1` (`Derived.max_lag`)", over="max"),
    Metric("version_diversity", "versions", "distinct oldest versions among the rollout's samples",
           scope="rollout", over="max"),
    Metric("partial_ratio", "fraction", "the rollout's samples whose tokens span more than one version",
           scope="rollout", over="mean"),
    Metric("max_partial_span", "versions", "largest newest − oldest version within one sample of the rollout",
           scope="rollout", over="max"),
    # Time and throughput.
    Metric("generate_time_s", "s", "generation of the step's rollout, on its first row (fully_async: engine "
           "time in generate calls since the previous drain, summed over engines)", over="sum"),
    Metric("train_time_s", "s", "the optimizer step as the trainer timed it", over="sum"),
    Metric("train_call_time_s", "s", "the train call as the driver waited for it, the samples' transfer "
           "included, spread over the rollout's steps", over="sum"),
    Metric("weight_sync_time_s", "s", "seconds the driver was held by the weight sync after the rollout, on its "
           "last row", over="sum"),
    Metric("trainer_wait_s", "s", "seconds the trainer waited for the rollout (fully_async: for the queue to hold "
           "a drain)", ASYNC, scope="rollout", over="sum"),
    Metric("tokens_per_s", "tokens/s", "trained tokens per wall second since the previous rollout was written",
           scope="rollout", over="mean"),
    Metric("samples_per_s", "samples/s", "trained samples per wall second since the previous rollout was written",
           scope="rollout", over="mean"),
    # Rollouts and the async machinery.
    Metric("rollout_reward_mean", "1", "mean reward of the whole rollout (drain)", scope="rollout", over="max"),
    Metric("sampling_rounds", "1", "generation rounds dynamic sampling needed to fill the rollout",
           frozenset({"sync", "async"}), scope="rollout", over="mean"),
    Metric("rollouts_ahead", "1", "rollouts generating or generated but not yet trained", frozenset({"async"}),
           scope="rollout", over="max"),
    Metric("queue_size", "groups", "prompt groups left in the queue after the drain", FULLY_ASYNC,
           scope="rollout", over="max"),
    Metric("rollouter_pause_s", "s", "seconds generation was paused for weight syncs since the previous drain",
           FULLY_ASYNC, scope="rollout", over="sum"),
    Metric("resumed_groups", "groups", "groups a weight sync interrupted that went on from their prefix "
           "(a running total)", FULLY_ASYNC, scope="rollout", over="max"),
    *(Metric(f"dropped_{reason}", "samples", f"samples dropped since the previous rollout (drain): {meaning}",
             modes, when, scope="rollout", over="sum")
      for reason, (meaning, modes, when) in _DROPS.items()),
    Metric("ledger_balanced", "bool", "the sample ledger balanced when the row was written "
           "(produced = trained + dropped + queued + in flight)", scope="rollout"),
    # Agentic rollouts (docs/agentic.md): the rollout's (drain's) trajectories.
    *(Metric(f"agent/{name}", unit, meaning, when=_AGENTIC, scope="rollout", over=how)
      for name, unit, meaning, how in _AGENT),
    *(Metric(f"agent/tool_errors_{kind}", "1", f"tool calls of the rollout's trajectories that failed: {kind}",
             when=_AGENTIC, scope="rollout", over="sum") for kind in TOOL_ERROR_KINDS),
    # Evaluation on held-out prompts (fasync/eval): on the first row written after an evaluation finished.
    Metric("eval/weight_version", "versions", "the weight version the evaluation generated with (the oldest, "
           "where a weight sync interrupted it)", when=_EVALUATES, over="last"),
    Metric("eval/time_s", "s", "seconds from the evaluation's start to its result (sync: the time training "
           "waited for it; async modes: it ran beside the rollouts)", when=_EVALUATES, over="sum"),
    Metric("eval/response_length_mean", "tokens", "mean length of the eval completions", when=_EVALUATES,
           over="last"),
    *(Metric(f"eval/{name}", unit, meaning, when=_EVALUATES, over="last") for name, unit, meaning in _EVAL_FIGURES),
    *(Metric(f"eval/{PER_SOURCE}/{name}", unit, f"{meaning}, over the eval prompts of one `data_source` (its name "
             "with any character but letters, digits and `_.@-` made `_`)", when=_EVALUATES + " and prompts with "
             "a `data_source`", over="last") for name, unit, meaning in _EVAL_FIGURES),
)


def metric_for(key: str) -> Optional[Metric]:
    """The metric a row's `key` is: its own entry, or the per-`data_source` eval metric it is one of
    (`eval/gsm8k/pass@k` is `eval/<data_source>/pass@k`); None for a key the registry does not define."""
    metric = METRICS.get(key)
    if metric is None and key.startswith("eval/") and key.count("/") == 2:
        metric = METRICS.get(f"eval/{PER_SOURCE}/{key.rsplit('/', 1)[1]}")
    return metric


def check_row(row: dict, mode: str) -> None:
    """Raise `UnregisteredMetric` for a key `METRICS` does not define for `mode`."""
    for key in row:
        metric = metric_for(key)
        if metric is None or mode not in metric.modes:
            raise UnregisteredMetric(f"metrics.jsonl key {key!r} is not registered for mode {mode} "
                                     "(fasync/metrics/registry.py)")


def over(name: str, rows: Iterable[dict]) -> Optional[float]:
    """The run-wide figure of metric `name` over `rows` (`Metric.over_rows`)."""
    return METRICS[name].over_rows(rows)
