"""From a config and a cost model to a prediction: what `fasync bench` would measure, from simulated time.

The quantities are computed as `fasync.metrics.measure` computes them from a real run's metrics: rates and
idle fractions over the steady window (from the first rollout's record to the last), so that predicted and
measured figures compare like for like.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from fasync.config.derived import derive
from fasync.config.schema import FasyncConfig
from fasync.simulate.costs import Costs, weight_bytes
from fasync.simulate.drivers import Simulation
from fasync.simulate.lengths import Lengths, planning_tokenizer
from fasync.simulate.state import LENGTH_BUCKETS, Recorder


@dataclass
class Prediction:
    mode: str
    rollouts: int
    optimizer_steps: int
    samples_per_s: float
    """Trained samples per second over the steady window."""
    time_to_steps_s: float
    """Simulated seconds until the last optimizer step's record (actor start-up not included)."""
    trainer_idle: float
    rollouter_idle: float
    staleness_mean: float
    staleness_max: int
    staleness_histogram: dict[int, int]
    """Trained samples by staleness in versions."""
    lag_mean_steps: float
    lag_max_steps: int
    lag_bound_steps: Optional[int]
    """`Derived.max_lag`: the most the rules allow (None: unbounded)."""
    queue_mean: float
    """Time-averaged groups in the queue (async: rollouts generated or generating ahead of training)."""
    queue_max: int
    stale_dropped: float
    """Fraction of the samples handed to the trainer that were too stale to train on."""
    stale_dropped_by_length: dict[str, float]
    """The same by completion-length bucket (tokens): the length bias."""
    rollouter_pause_s: float
    resumed_groups: int
    ledger: dict
    ledger_balanced: bool
    speedup: Optional[float] = None
    """samples/s over sync's on the same config (filled in by the caller that simulated sync)."""
    settings: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def simulate(cfg: FasyncConfig, costs: Costs, lengths: Lengths) -> Prediction:
    """Run `cfg` in simulated time."""
    derived = derive(cfg)
    vocab = planning_tokenizer(cfg).vocab_size
    simulation = Simulation(cfg, derived, costs, lengths, weight_bytes(cfg, vocab))
    recorder = simulation.run()
    return summarize(cfg, recorder, simulation.ledger.as_dict(), derived.max_lag.steps)


def _busy_within(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(e, end) - max(s, start)) for s, e in intervals)


def _mean(histogram: dict[int, int]) -> float:
    total = sum(histogram.values())
    return sum(key * count for key, count in histogram.items()) / total if total else 0.0


def summarize(cfg: FasyncConfig, recorder: Recorder, ledger: dict, lag_bound: Optional[int]) -> Prediction:
    records = recorder.records
    first, last = records[0][0], records[-1][0]
    window = last - first
    trained = sum(samples for _, samples, _ in records[1:])
    span = max(window, 1e-12)
    engines = recorder.engines
    limit = recorder.max_new_tokens
    buckets = {}
    for bucket in range(LENGTH_BUCKETS):
        low, high = bucket * limit // LENGTH_BUCKETS + 1, (bucket + 1) * limit // LENGTH_BUCKETS
        if recorder.taken[bucket] and high >= low:
            buckets[f"{low}-{high}"] = recorder.stale[bucket] / recorder.taken[bucket]
    handed = sum(recorder.taken.values())
    return Prediction(
        mode=cfg.mode,
        rollouts=len(records),
        optimizer_steps=sum(steps for _, _, steps in records),
        samples_per_s=trained / span if window > 0 else 0.0,
        time_to_steps_s=last,
        trainer_idle=_fraction(1 - _busy_within(recorder.trainer_busy, first, last) / span) if window else 1.0,
        rollouter_idle=_fraction(1 - sum(_busy_within(busy, first, last) for busy in recorder.engine_busy)
                                 / (engines * span)) if window else 1.0,
        staleness_mean=_mean(recorder.staleness),
        staleness_max=max(recorder.staleness, default=0),
        staleness_histogram=dict(sorted(recorder.staleness.items())),
        lag_mean_steps=_mean(recorder.lag_steps),
        lag_max_steps=max(recorder.lag_steps, default=0),
        lag_bound_steps=lag_bound,
        queue_mean=recorder.queue_area / last if last else 0.0,
        queue_max=recorder.queue_max,
        stale_dropped=sum(recorder.stale.values()) / handed if handed else 0.0,
        stale_dropped_by_length=buckets,
        rollouter_pause_s=recorder.pause_s,
        resumed_groups=recorder.resumed_groups,
        ledger=ledger,
        ledger_balanced=recorder.unbalanced_at is None and ledger["balanced"],
    )


def _fraction(value: float) -> float:
    return min(max(value, 0.0), 1.0)
