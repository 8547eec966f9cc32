"""What one benchmark run reports, computed from its metrics records alone.

Rates and idle fractions are taken over the steady window, from the first record to the last: the
Ray start, the actor start and the first rollout's generation happen before it and are the same
fixed cost in every mode, which no overlap can remove. Time to target is measured from the start
of the run (metrics `wall_time`), so it includes them.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, fields

from fasync.metrics.registry import METRICS, over

REWARD_WINDOW = 3
"""Rollouts averaged before comparing with the target, as `train.target_reward` does."""

CORRECTION_METRICS = ("is/kl_k3", "is/log_ppl_diff", "is/chi2_token", "is/ess_token", "is/ess_seq",
                      "is/weight_max", "is/truncated_token_frac")


@dataclass
class ModeReport:
    mode: str
    exit_code: int
    rollouts: int
    samples_per_s: float
    """Trained samples per second over the steady window."""
    time_to_target_s: float | None
    """Seconds since the run started when the running mean reward first reached the target (None: never)."""
    staleness_mean: float
    staleness_max: int
    stale_dropped: float
    """Fraction of the samples generated for training that the trainer dropped as too stale (fully_async):
    generation the samples/s does not count."""
    trainer_idle: float
    """Fraction of the window the trainer was not in a train call: waiting for data, for a weight sync or
    for the driver."""
    rollouter_idle: float
    """Fraction of the window the engines had no generate call running (averaged over the engines)."""
    generate_s: float
    """Engine time generating in the window (sum over engines)."""
    train_s: float
    """The trainer's optimizer steps in the window, as the trainer times them."""
    train_call_s: float
    """The train calls in the window as the driver waited for them: the steps plus moving the samples,
    advantages, batching and (with the `recompute` anchor and several steps per rollout) the extra forward."""
    weight_sync_s: float
    """Time the driver was held by weight syncs in the window."""
    window_s: float
    correction: dict[str, float] = field(default_factory=dict)
    runs_samples_per_s: list[float] = field(default_factory=list)
    """samples/s of each run this report stands for."""
    runs_reached: int = 0
    """How many of those runs reached the target."""

    def as_dict(self) -> dict:
        return asdict(self)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def time_to_target(records: list[dict], target: float) -> float | None:
    """`wall_time` of the rollout whose last-`REWARD_WINDOW` mean reward first reached `target`."""
    rewards: list[float] = []
    for record in last_per_rollout(records):
        rewards.append(record["rollout_reward_mean"])
        if len(rewards) >= REWARD_WINDOW and _mean(rewards[-REWARD_WINDOW:]) >= target:
            return record["wall_time"]
    return None


def last_per_rollout(records: list[dict]) -> list[dict]:
    """The last step record of each rollout (the one written with the rollout's wall time)."""
    by_rollout: dict[int, dict] = {}
    for record in records:
        by_rollout[record["rollout"]] = record
    return list(by_rollout.values())


def measure(mode: str, exit_code: int, records: list[dict], target: float, engines: int) -> ModeReport:
    rollouts = last_per_rollout(records)
    # The first rollout's record closes the start-up; the window is everything after it.
    first = rollouts[0]["rollout"] if rollouts else 0
    window = [r for r in records if r["rollout"] != first]
    window_s = (rollouts[-1]["wall_time"] - rollouts[0]["wall_time"]) if len(rollouts) > 1 else 0.0
    span = max(window_s, 1e-9)

    def total(key: str) -> float:
        return over(key, window)

    generate_s, train_call_s = total("generate_time_s"), total("train_call_time_s")
    correction = {key: _mean(METRICS[key].values(records)) for key in CORRECTION_METRICS}
    reached = time_to_target(records, target)
    samples_per_s = total("num_samples") / span if window_s else 0.0
    trained = over("num_samples", records)
    stale = over("dropped_stale", records)
    return ModeReport(
        mode=mode,
        exit_code=exit_code,
        rollouts=len(rollouts),
        samples_per_s=samples_per_s,
        time_to_target_s=reached,
        staleness_mean=over("staleness_mean", records) or 0.0,
        staleness_max=over("staleness_max", records) or 0,
        stale_dropped=stale / (stale + trained) if stale + trained else 0.0,
        **dict(zip(("trainer_idle", "rollouter_idle"), idle_fractions(window, window_s, engines))),
        generate_s=generate_s,
        train_s=total("train_time_s"),
        train_call_s=train_call_s,
        weight_sync_s=total("weight_sync_time_s"),
        window_s=window_s,
        correction={key: value for key, value in correction.items() if any(key in r for r in records)},
        runs_samples_per_s=[samples_per_s],
        runs_reached=int(reached is not None),
    )


def idle_fractions(rows: list[dict], span_s: float, engines: int) -> tuple[float, float]:
    """(trainer, rollouter) idle fractions of a window of `span_s` wall seconds whose step rows are `rows`:
    the time outside train calls, and outside generate calls averaged over the engines; (1, 1) for an
    empty window."""
    if span_s <= 0:
        return 1.0, 1.0
    return (_fraction(1.0 - over("train_call_time_s", rows) / span_s),
            _fraction(1.0 - over("generate_time_s", rows) / (engines * span_s)))


def _fraction(value: float) -> float:
    """Clamped to [0, 1]: phase times measured by different clocks may overlap the window's edges a little."""
    return min(max(value, 0.0), 1.0)


def ideal_speedup(sync: ModeReport) -> float:
    """The overlap limit from the sync run's own phases: (T_generate + T_train) / max(T_generate, T_train),
    T_train being the optimizer steps. What sync spends besides (the blocking weight push, the anchor
    forward and the samples' transfer inside its train calls) is in neither phase: a mode that does
    not pay it can beat this limit."""
    longest = max(sync.generate_s, sync.train_s)
    return (sync.generate_s + sync.train_s) / longest if longest > 0 else 1.0


_COMBINED = {"mode", "exit_code", "rollouts", "time_to_target_s", "staleness_max", "correction", "runs_samples_per_s",
             "runs_reached"}


def median_report(reports: list[ModeReport]) -> ModeReport:
    """Field by field, the median of repeated runs of one mode: the worst exit code, the largest
    staleness, and the time to target of the runs that reached it."""
    if len(reports) == 1:
        return reports[0]

    def middle(values):
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    merged = {f.name: middle([getattr(r, f.name) for r in reports]) for f in fields(ModeReport)
              if f.name not in _COMBINED}
    keys = set().union(*(r.correction for r in reports))
    return ModeReport(
        mode=reports[0].mode,
        exit_code=max(r.exit_code for r in reports),
        rollouts=round(statistics.median(r.rollouts for r in reports)),
        time_to_target_s=middle([r.time_to_target_s for r in reports]),
        staleness_max=max(r.staleness_max for r in reports),
        correction={key: middle([r.correction.get(key) for r in reports]) for key in sorted(keys)},
        runs_samples_per_s=[value for r in reports for value in r.runs_samples_per_s],
        runs_reached=sum(r.runs_reached for r in reports),
        **merged,
    )
