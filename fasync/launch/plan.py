"""Where each actor runs: computed from the config and the model's dimensions, printed by `--dry-run`; and
`Resolved`, the config with everything that follows from it, worked out once (`resolve`).

Actors on GPUs are placed in Ray placement groups, so that Ray reserves every GPU of the run at once
and cannot put two engines on one GPU:
- colocated: one group of one-GPU bundles; trainer rank r holds bundle r and shares it with exactly one
  engine's worker (engine e holds bundles e·TP … e·TP + TP − 1). The engine's memory share is planned
  from the trainer's estimate (fasync/memory.py), not left to whichever starts first.
- disaggregated: the engines' bundles (one GPU each, TP per engine) and the trainer ranks' bundles in
  two groups.
`resources.gpus_per_engine` is the engine's tensor-parallel size (vLLM); its actor sits on its first
bundle and names all of them (`Slot.bundles`) for its workers. Groups are packed onto as few nodes as
hold them, so the trainer ranks spread over every GPU they asked for, across nodes. The node and GPU
index of each bundle assume nodes of `resources.gpus_per_node` GPUs filled in order; the live cluster
decides (fasync/launch/placement.py reports it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from fasync.config.derived import Derived
from fasync.config.schema import FasyncConfig
from fasync.memory import GB, ModelDims, derive_with_model, estimate


@dataclass(frozen=True)
class ActorSpec:
    role: str
    count: int
    cpus: float
    gpus: float


@dataclass(frozen=True)
class GroupSpec:
    name: str
    bundles: tuple[dict[str, float], ...]
    strategy: str = "PACK"


@dataclass(frozen=True)
class Slot:
    """An actor's place: its placement group and bundles (the first hosts the actor itself)."""

    group: str
    bundles: tuple[int, ...]
    gpus: float
    """GPUs the actor itself takes from its first bundle."""
    worker_gpus: float = 0.0
    """A tensor-parallel engine (more than one bundle): what each of its vLLM workers takes from its own bundle.
    The actor then takes none, so that its first bundle's GPU is left for the worker placed there."""

    def worker_environment(self) -> dict[str, str]:
        """What vLLM's Ray executor reads to place a tensor-parallel engine's workers on exactly this slot's
        bundles, each with `worker_gpus` of its GPU (nothing for an engine of one GPU, which runs in its actor).
        The engine core stays in the actor's process: only there is the actor's placement group Ray's current
        one (a process of vLLM's own would reserve a group of its own, which the plan's groups leave no GPU for)."""
        if len(self.bundles) < 2:
            return {}
        return {"VLLM_RAY_BUNDLE_INDICES": ",".join(map(str, self.bundles)),
                "VLLM_RAY_PER_WORKER_GPUS": f"{self.worker_gpus:g}", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@dataclass(frozen=True)
class ResourcePlan:
    mode: str
    actors: tuple[ActorSpec, ...]
    ray_address: str | None
    derived: Derived
    groups: tuple[GroupSpec, ...] = ()
    engine_slots: tuple[Slot, ...] = ()
    trainer_slots: tuple[Slot, ...] = ()
    engine_memory_fraction: float | None = None
    """Colocated: the share of each GPU's memory the engine may take (vLLM's gpu_memory_utilization)."""
    gpus_per_node: int | None = None

    def _spec(self, role: str) -> ActorSpec:
        return next(spec for spec in self.actors if spec.role == role)

    def _options(self, role: str, slots: tuple[Slot, ...], index: int) -> dict:
        spec = self._spec(role)
        if not slots:
            return {"num_cpus": spec.cpus, "num_gpus": spec.gpus}
        slot = slots[index]
        return {"num_cpus": spec.cpus, "num_gpus": slot.gpus, "slot": slot}

    def engine_options(self, index: int = 0) -> dict:
        """`num_cpus`, `num_gpus`, and on GPUs the `slot` (fasync.launch.placement turns it into Ray's option)."""
        return self._options("rollout engine", self.engine_slots, index)

    def trainer_options(self, rank: int = 0) -> dict:
        return self._options("trainer rank", self.trainer_slots, rank)

    def engine_workers(self) -> list[int]:
        """How many vLLM workers each engine runs (its tensor-parallel size; one on CPU)."""
        count = self._spec("rollout engine").count
        return [len(slot.bundles) for slot in self.engine_slots] if self.engine_slots else [1] * count

    def node_and_gpu(self, group: str, bundle: int) -> tuple[int, int]:
        """Expected node and GPU index of a bundle: groups laid out in order over nodes of gpus_per_node GPUs."""
        offset = 0
        for spec in self.groups:
            if spec.name == group:
                break
            offset += int(sum(b.get("GPU", 0) for b in spec.bundles))
        gpu = offset + int(sum(b.get("GPU", 0) for b in next(g for g in self.groups if g.name == group).bundles[:bundle]))
        per_node = self.gpus_per_node or max(int(self.gpus_needed), 1)
        return gpu // per_node, gpu % per_node

    def describe_placement(self) -> list[str]:
        if not self.groups:
            return []
        lines = ["placement:"]
        for spec in self.groups:
            lines.append(f"  group {spec.name}: {len(spec.bundles)} bundles of {spec.bundles[0]} ({spec.strategy})")
        for role, slots in (("trainer rank", self.trainer_slots), ("rollout engine", self.engine_slots)):
            for index, slot in enumerate(slots):
                where = ", ".join("node {} GPU {}".format(*self.node_and_gpu(slot.group, b)) for b in slot.bundles)
                held = (f"{slot.gpus:g} GPU" if not slot.worker_gpus else
                        f"{slot.worker_gpus:g} GPU for each of its {len(slot.bundles)} vLLM workers")
                lines.append(f"  {role} {index}: {slot.group} bundle{'s' if len(slot.bundles) > 1 else ''} "
                             f"{', '.join(map(str, slot.bundles))} ({where}), {held}")
        if self.engine_memory_fraction is not None:
            lines.append(f"  engine memory share per GPU: {self.engine_memory_fraction:.2f} "
                         "(what the trainer's estimate leaves)")
        lines.append("  trainer rendezvous: rank 0's node IP, a free port there")
        return lines

    @property
    def cpus_needed(self) -> float:
        return sum(spec.count * spec.cpus for spec in self.actors)

    @property
    def gpus_needed(self) -> float:
        return sum(spec.count * spec.gpus for spec in self.actors)

    def local_cluster_cpus(self) -> int:
        """Logical CPUs for a local cluster: at least what the plan asks, so that no actor waits to be placed."""
        return max(os.cpu_count() or 1, int(self.cpus_needed + 0.999))

    def summary(self) -> str:
        """What `--dry-run` prints and plan.txt holds: the cluster, the actors, the placement and the batching."""
        cluster = self.ray_address or ("local Ray cluster started by fasync (a running `ray start` cluster or "
                                       "RAY_ADDRESS is joined only through resources.ray_address)")
        lines = [f"mode: {self.mode}", f"cluster: {cluster}", "actors:"]
        for spec in self.actors:
            lines.append(f"  {spec.count} × {spec.role}: {spec.cpus:g} CPU, {spec.gpus:g} GPU each")
        lines.append(f"total: {self.cpus_needed:g} CPU, {self.gpus_needed:g} GPU")
        lines += self.describe_placement()
        d = self.derived
        lines.append("batching:")
        lines.append(f"  samples per rollout: {d.samples_per_rollout}")
        every_epoch = d.optimizer_steps_per_rollout
        lines.append(f"  optimizer steps per rollout: {d.num_steps_per_rollout} × "
                     f"{d.effective_global_batch_size} samples"
                     + (f" per epoch, {every_epoch} in all" if every_epoch != d.num_steps_per_rollout else ""))
        lines.append(f"  trimmed per rollout: {d.trimmed_samples_per_rollout}")
        lines.append(f"  micro batches per step per rank: {d.micro_batches_per_step}")
        lines.append(f"  worst policy lag: {d.max_lag.steps_and_versions()}")
        lines.append(f"  ratio anchor: {d.ratio_anchor}")
        return "\n".join(lines)


def _slots(group: str, count: int, width: int, share: float) -> tuple[Slot, ...]:
    if width > 1:  # tensor-parallel engines: the workers hold the GPUs, not the actor
        return tuple(Slot(group, tuple(range(i * width, (i + 1) * width)), 0.0, share) for i in range(count))
    return tuple(Slot(group, tuple(range(i * width, (i + 1) * width)), share) for i in range(count))


def _placement(cfg: FasyncConfig, derived: Derived, dims: ModelDims | None) -> dict:
    res = cfg.resources
    tp, per_rank = res.gpus_per_engine, res.gpus_per_trainer_rank
    engines, ranks = res.num_rollout_engines, res.trainer_ranks
    if res.colocate and tp and per_rank:
        # One bundle per GPU; each rank's bundles also hold one engine worker each.
        bundles = max(engines * tp, ranks * per_rank)
        group = GroupSpec("shared", tuple({"GPU": 1.0, "CPU": 2.0} for _ in range(bundles)))
        return {"groups": (group,), "engine_slots": _slots("shared", engines, tp, 0.5),
                "trainer_slots": _slots("shared", ranks, per_rank, 0.5),
                "engine_memory_fraction": engine_memory_fraction(cfg, derived, dims)}
    groups, placed = [], {}
    if tp:
        groups.append(GroupSpec("engines", tuple({"GPU": 1.0, "CPU": 1.0} for _ in range(engines * tp))))
        placed["engine_slots"] = _slots("engines", engines, tp, 1.0)
    if per_rank:
        groups.append(GroupSpec("trainers", tuple({"GPU": float(per_rank), "CPU": 1.0} for _ in range(ranks))))
        placed["trainer_slots"] = tuple(Slot("trainers", (r,), float(per_rank)) for r in range(ranks))
    return {"groups": tuple(groups), **placed}


def engine_memory_fraction(cfg: FasyncConfig, derived: Derived, dims: ModelDims | None) -> float | None:
    """Colocated: the share of each GPU the trainer's memory estimate leaves to the engine (vLLM's
    `gpu_memory_utilization`), rounded down to a hundredth; None where the model's size is not known."""
    found = estimate(cfg, derived, dims)
    if found is None:
        return None
    engine = sum(t.bytes for t in found.terms if t.name.startswith("engine "))
    trainer = found.total - engine
    return max(0.0, (cfg.resources.gpu_memory_gb * GB - trainer) / (cfg.resources.gpu_memory_gb * GB)) // 0.01 / 100


def plan_resources(cfg: FasyncConfig, derived: Derived, dims: ModelDims | None) -> ResourcePlan:
    """Where each actor of `cfg` runs, for its `derived` quantities and the model's `dims` (the colocated engine's
    memory share follows from them)."""
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
    return ResourcePlan(cfg.mode, tuple(actors), res.ray_address, derived, gpus_per_node=res.gpus_per_node,
                        **_placement(cfg, derived, dims))


@dataclass(frozen=True)
class Resolved:
    """A config and everything that follows from it, worked out once (`resolve`): `fasync train`
    (fasync.commands.train) hands this one value to the run's driver, rollouter and trainer, so that none of
    them derives the config or reads the model's files again."""

    config: FasyncConfig
    derived: Derived
    model_dims: ModelDims | None
    """From `model.path`'s config.json or the embedded model's keys; None where they cannot be read."""
    plan: ResourcePlan


def resolve(cfg: FasyncConfig, model: tuple[ModelDims | None, Derived] | None = None) -> Resolved:
    """Read the model's dimensions, derive the config with them (`train.strategy`'s default follows from the
    model's size) and plan the actors; `model`: what `derive_with_model(cfg)` gave, where the caller has it."""
    dims, derived = model if model is not None else derive_with_model(cfg)
    return Resolved(cfg, derived, dims, plan_resources(cfg, derived, dims))
