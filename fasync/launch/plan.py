"""Where each actor runs: computed from the config alone, printed by `--dry-run`."""

from __future__ import annotations

import os
from dataclasses import dataclass

from fasync.config.derived import Derived, derive
from fasync.config.schema import FasyncConfig


@dataclass(frozen=True)
class ActorSpec:
    role: str
    count: int
    cpus: float
    gpus: float


@dataclass(frozen=True)
class ResourcePlan:
    mode: str
    actors: tuple[ActorSpec, ...]
    ray_address: str | None
    derived: Derived

    def _spec(self, role: str) -> ActorSpec:
        return next(spec for spec in self.actors if spec.role == role)

    def engine_options(self) -> dict:
        spec = self._spec("rollout engine")
        return {"num_cpus": spec.cpus, "num_gpus": spec.gpus}

    def trainer_options(self) -> dict:
        spec = self._spec("trainer rank")
        return {"num_cpus": spec.cpus, "num_gpus": spec.gpus}

    @property
    def cpus_needed(self) -> float:
        return sum(spec.count * spec.cpus for spec in self.actors)

    @property
    def gpus_needed(self) -> float:
        return sum(spec.count * spec.gpus for spec in self.actors)

    def local_cluster_cpus(self) -> int:
        """Logical CPUs for a local cluster: at least what the plan asks, so that no actor waits to be placed."""
        return max(os.cpu_count() or 1, int(self.cpus_needed + 0.999))

    def describe(self) -> str:
        cluster = self.ray_address or "local Ray cluster started by fasync"
        lines = [f"mode: {self.mode}", f"cluster: {cluster}", "actors:"]
        for spec in self.actors:
            lines.append(f"  {spec.count} × {spec.role}: {spec.cpus:g} CPU, {spec.gpus:g} GPU each")
        lines.append(f"total: {self.cpus_needed:g} CPU, {self.gpus_needed:g} GPU")
        d = self.derived
        lines.append("batching:")
        lines.append(f"  samples per rollout: {d.samples_per_rollout}")
        lines.append(f"  optimizer steps per rollout: {d.num_steps_per_rollout} × "
                     f"{d.effective_global_batch_size} samples")
        lines.append(f"  trimmed per rollout: {d.trimmed_samples_per_rollout}")
        lines.append(f"  micro batches per step per rank: {d.micro_batches_per_step}")
        lines.append(f"  worst policy lag: {d.max_lag.describe()}")
        lines.append(f"  ratio anchor: {d.ratio_anchor}")
        return "\n".join(lines)


def plan_resources(cfg: FasyncConfig) -> ResourcePlan:
    res = cfg.resources
    share = 0.5 if res.colocate else 1.0
    engine_gpus = res.gpus_per_engine * share
    trainer_gpus = res.gpus_per_trainer_rank * share
    actors = [
        ActorSpec("rollout engine", res.num_rollout_engines, float(res.rollout_threads) if not engine_gpus else 1.0,
                  engine_gpus),
        ActorSpec("trainer rank", res.trainer_ranks, float(res.train_threads) if not trainer_gpus else 1.0,
                  trainer_gpus),
    ]
    if cfg.mode == "fully_async":
        # Coordination only (it holds the sample queue and waits on the engines), so it takes no CPU slot.
        actors += [ActorSpec("rollouter and its sample queue", 1, 0.0, 0.0)]
    return ResourcePlan(cfg.mode, tuple(actors), res.ray_address, derive(cfg))
