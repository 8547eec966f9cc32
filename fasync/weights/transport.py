"""Which way the trainer's weights travel to the engines: a transport per placement.

- `cpu`: the trainer's state dict crosses to every engine actor (`fasync.weights.cpu` hands it to vLLM's
  CPU build); the torch engine takes this path wherever it runs.
- `ipc` (colocated: each engine worker shares its GPU with a trainer rank) and `nccl` (engines on GPUs of
  their own): vLLM's weight transfer engines, driven by the trainer ranks (`fasync.weights.sender`).

Torch-free: `fasync check` asks it whether a placement's transport reaches every engine (rule R007).
"""

from __future__ import annotations

from typing import Literal

from fasync.errors import ConfigurationError

Transport = Literal["cpu", "ipc", "nccl"]


def transport_for(gpus_per_engine: int, colocate: bool) -> Transport:
    """The transport a vLLM engine's placement uses: CPU engines take the state dict, a colocated GPU engine CUDA IPC
    handles (trainer and engine share the device), a GPU engine of its own an NCCL broadcast."""
    if gpus_per_engine == 0:
        return "cpu"
    return "ipc" if colocate else "nccl"


def transport_of(cfg) -> Transport:
    """The transport a run's weight syncs take: a vLLM engine's by its placement; the torch engine loads a
    state dict (the `cpu` path) wherever it runs."""
    if cfg.rollout.engine != "vllm":
        return "cpu"
    return transport_for(cfg.resources.gpus_per_engine, cfg.resources.colocate)


def ipc_shortfall(cfg) -> tuple[int, int] | None:
    """(engine GPUs, trainer GPUs) when the `ipc` transport cannot reach every engine worker: CUDA IPC hands
    each worker the tensors of the trainer rank on its own GPU, so every engine GPU needs one (lint rule R007,
    and `check_transport` when a run starts); None when it can, or the run takes another transport."""
    res = cfg.resources
    engine_gpus = res.num_rollout_engines * res.gpus_per_engine
    trainer_gpus = res.trainer_ranks * res.gpus_per_trainer_rank
    if transport_of(cfg) == "ipc" and engine_gpus > trainer_gpus:
        return engine_gpus, trainer_gpus
    return None


def check_transport(cfg) -> None:
    """Raise a ConfigurationError for a placement whose transport cannot reach every engine worker."""
    shortfall = ipc_shortfall(cfg)
    if shortfall is not None:
        raise ConfigurationError(
            f"resources: colocated vLLM engines take their weights over CUDA IPC from the trainer rank on the same "
            f"GPU, but the engines use {shortfall[0]} GPUs (num_rollout_engines × gpus_per_engine) and the trainer "
            f"ranks only {shortfall[1]}: raise resources.trainer_ranks to {shortfall[0]}, or set "
            "resources.colocate: false (`fasync check` reports this as R007)")
