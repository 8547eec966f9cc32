"""The cost model: simulated seconds for a generate call, a train call and a weight sync.

Every cost is linear in what the real code does, so that a run's measured phase times determine it
(`fasync.simulate.calibrate`):

- a generate call on one engine: `call + prefill × prefilled tokens + Σ_steps (step + row × rows)`. The
  torch engine decodes a static batch, so every row of the call counts in every step until the longest
  is done; vLLM batches continuously, so a row stops counting once it has finished.
- a train call on the trainer ranks: `call + Σ_steps (step + Σ_micro batches (micro_batch + padded tokens /
  tokens_per_s))` on the busiest rank, where the micro batches are cut as the trainer cuts them (by
  length, `fasync.train.batching`). The `recompute` anchor adds one forward pass over the micro batches of
  every step after a call's first, a third of their forward and backward.
- a weight sync: `weight_sync + bytes / bandwidth`.
- while generation and training overlap, both run `overlap_slowdown` times slower (shared cores or
  memory bandwidth; 1 on separate devices).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Optional

from fasync.config.schema import FasyncConfig, SimulateCosts

FORWARD_SHARE = 1 / 3
"""A forward pass alone against a forward and backward: the backward costs about twice the forward."""


@dataclass(frozen=True)
class Costs:
    """Seconds (and seconds per token or row); `Costs.from_config` reads the user's milliseconds."""

    engine_call: float = 0.0035
    engine_prefill_token: float = 1.5e-6
    engine_step: float = 0.0014
    engine_row: float = 2.2e-5
    trainer_call: float = 0.016
    trainer_step: float = 0.003
    trainer_micro_batch: float = 0.002
    trainer_token: float = 1.9e-5
    weight_sync: float = 0.006
    weight_sync_per_byte: float = 0.0
    overlap_slowdown: float = 1.0
    source: str = "default costs (the quickstart's tiny model on two CPU cores)"

    def as_dict(self) -> dict:
        return asdict(self)

    # -- generation ------------------------------------------------------------------------------

    def decode_step(self, rows: int) -> float:
        return self.engine_step + self.engine_row * rows

    def call_time_to(self, steps: int, prefill_tokens: int, takes: list[int], static: bool) -> float:
        """Seconds from a call's start to the end of its decode step `steps` (all of them: the whole call)."""
        row_steps = len(takes) * steps if static else sum(min(take, steps) for take in takes)
        return (self.engine_call + self.engine_prefill_token * prefill_tokens
                + self.engine_step * steps + self.engine_row * row_steps)

    def steps_done_by(self, elapsed: float, prefill_tokens: int, takes: list[int], static: bool) -> int:
        """Decode steps a call has finished `elapsed` seconds after it started, counting the step in
        progress (an abort takes effect between two steps)."""
        spent = self.engine_call + self.engine_prefill_token * prefill_tokens
        remaining = sorted(takes)
        rows, index, step = len(takes), 0, 0
        steps = remaining[-1] if remaining else 0
        while step < steps and spent < elapsed:
            while not static and index < len(remaining) and remaining[index] <= step:
                index += 1
            spent += self.decode_step(rows if static else rows - index)
            step += 1
        return step

    # -- training ------------------------------------------------------------------------------

    def train_call(self, steps: list[list[tuple[int, int]]], micro_batch_size: int, ranks: int,
                   recompute: bool) -> float:
        """One train call over optimizer steps, each given as (prompt + completion length, samples) runs. The
        `recompute` anchor costs a forward pass over the micro batches of every step after the first: the
        first step's anchor is its own forward, the weights not having moved yet (fasync.train.trainer)."""
        anchors = FORWARD_SHARE * self._passes(steps[1:], micro_batch_size, ranks) if recompute else 0.0
        return self.trainer_call + self.optimizer_steps(steps, micro_batch_size, ranks) + anchors

    def optimizer_steps(self, steps: list[list[tuple[int, int]]], micro_batch_size: int, ranks: int) -> float:
        """The part of a train call the trainer times as its steps (`train_time_s`)."""
        return self.trainer_step * len(steps) + self._passes(steps, micro_batch_size, ranks)

    def _passes(self, steps: list[list[tuple[int, int]]], micro_batch_size: int, ranks: int) -> float:
        """Forward and backward over the steps' micro batches on the busiest rank."""
        batches, padded = _micro_batches(steps, micro_batch_size, ranks)
        return self.trainer_micro_batch * batches + self.trainer_token * padded

    # -- weight syncs --------------------------------------------------------------------------

    def sync(self, weight_bytes: int) -> float:
        return self.weight_sync + self.weight_sync_per_byte * weight_bytes

    # -- from and to the config --------------------------------------------------------------

    @classmethod
    def from_config(cls, section: SimulateCosts, base: Optional[Costs] = None) -> Costs:
        """`base` (the defaults, or a calibration) with the config's non-null costs on top."""
        costs = base or cls()
        given = {name: value for name, value in section.model_dump().items() if value is not None}
        if not given:
            return costs
        updates = {}
        for name, value in given.items():
            field, unit = _CONFIG_FIELDS[name]
            updates[field] = _UNITS[unit][0](value)
        return replace(costs, **updates, source=f"{costs.source}; simulate.costs sets {', '.join(sorted(given))}")

    def to_config(self) -> dict:
        """The `simulate.costs` section that gives these costs (what `--calibrate` prints, to paste)."""
        out = {}
        for name, (field, unit) in _CONFIG_FIELDS.items():
            value = getattr(self, field)
            out[name] = None if unit == "gb_per_s" and not value else float(f"{_UNITS[unit][1](value):.4g}")
        return out


def _micro_batches(steps: list[list[tuple[int, int]]], micro_batch_size: int, ranks: int) -> tuple[int, int]:
    """Micro batches and padded tokens of the busiest rank over all steps. A rank's share of a step is every
    `ranks`-th sample in length order, as `rank_micro_batches` deals them, cut into micro batches that pad to
    their longest sample."""
    batches = padded = 0
    for runs in steps:
        position, room, longest, count = 0, 0, 0, 0
        for length, samples in sorted(runs):
            mine = -(-(position + samples) // ranks) - -(-position // ranks)
            position += samples
            while mine:
                if room == 0:
                    padded += longest * micro_batch_size if count else 0
                    count, room = count + 1, micro_batch_size
                used = min(room, mine)
                room, mine, longest = room - used, mine - used, length
        padded += longest * (micro_batch_size - room) if count else 0
        batches += count
    return batches, padded


# (config value → seconds, seconds → config value), per unit.
_UNITS = {
    "ms": (lambda value: value / 1000, lambda value: value * 1000),
    "per_s": (lambda value: 1 / value, lambda value: 1 / value),
    "gb_per_s": (lambda value: 1e-9 / value, lambda value: 1e-9 / value),
    "plain": (lambda value: value, lambda value: value),
}

_CONFIG_FIELDS = {
    "engine_call_ms": ("engine_call", "ms"),
    "engine_prefill_tokens_per_s": ("engine_prefill_token", "per_s"),
    "engine_step_ms": ("engine_step", "ms"),
    "engine_row_ms": ("engine_row", "ms"),
    "trainer_call_ms": ("trainer_call", "ms"),
    "trainer_step_ms": ("trainer_step", "ms"),
    "trainer_micro_batch_ms": ("trainer_micro_batch", "ms"),
    "trainer_tokens_per_s": ("trainer_token", "per_s"),
    "weight_sync_ms": ("weight_sync", "ms"),
    "weight_sync_gb_per_s": ("weight_sync_per_byte", "gb_per_s"),
    "overlap_slowdown": ("overlap_slowdown", "plain"),
}


_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def weight_bytes(cfg: FasyncConfig, vocab_size: int) -> int:
    """Bytes a weight sync moves: the embedded model's parameters, or a Hugging Face model's estimated from its
    config.json (attention and a gated MLP per layer, untied embeddings); 0 when that file is missing."""
    model = cfg.model
    per = _DTYPE_BYTES[model.dtype]
    if model.path is None:
        d = model.d_model
        return per * (model.n_layers * 12 * d * d + (vocab_size + model.max_seq_len) * d)
    import json
    from pathlib import Path

    config = Path(model.path) / "config.json"
    if not config.is_file():
        return 0
    hf = json.loads(config.read_text())
    hidden, layers = hf.get("hidden_size", 0), hf.get("num_hidden_layers", 0)
    inner, vocab = hf.get("intermediate_size", 4 * hidden), hf.get("vocab_size", vocab_size)
    return per * (layers * (4 * hidden * hidden + 3 * hidden * inner) + 2 * vocab * hidden)
