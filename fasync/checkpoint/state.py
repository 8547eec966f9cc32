"""What goes into a checkpoint and comes back out: the trainer's model and optimizer through
torch.distributed.checkpoint (DCP), every RNG, and the policy exported for use elsewhere.

DCP is used for every strategy. Under FSDP2 each rank writes its own shards of the fp32 master weights and
of the AdamW state (no gather to one rank, no whole-model copy in any process); DCP reshards on load, so a
checkpoint also loads into a different number of ranks, or whole into one process for `fasync export`.
Under ddp the state is replicated and DCP writes one copy.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import torch

from fasync.checkpoint import TRAINER, Checkpoint, CheckpointError


def capture_rngs() -> dict:
    """This process's python, numpy and torch (and CUDA) generators."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rngs(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# DCP warns that it runs in one process when no process group exists (ddp on one rank, `fasync export`): that
# is intended here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


def _failures() -> tuple:
    """What reading or writing a checkpoint raises: DCP's CheckpointException is a BaseException."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def _stateful(trainer) -> tuple[dict, dict]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    # Sharded (DTensor) under FSDP2, plain tensors under ddp; the optimizer's state exists before its first step.
    return get_state_dict(trainer.model, trainer.optimizer)


def save_trainer(trainer, checkpoint_dir: Path) -> None:
    """Every rank calls: the model and optimizer into `checkpoint_dir/trainer` through DCP, and this rank's
    counters and RNGs into trainer/rank-R.pt."""
    import torch.distributed.checkpoint as dcp

    model, optimizer = _stateful(trainer)
    directory = Path(checkpoint_dir) / TRAINER
    try:
        dcp.save({"model": model, "optimizer": optimizer}, checkpoint_id=str(directory))
        torch.save({"rollouts": trainer.rollouts, "steps": trainer.steps, "rngs": capture_rngs()},
                   directory / f"rank-{trainer.rank}.pt")
    except _failures() as error:
        raise CheckpointError(f"cannot write the trainer's checkpoint to {directory} ({_first_line(error)}); the "
                              "previous checkpoints are kept") from error


def load_trainer(trainer, checkpoint_dir: Path) -> None:
    """Every rank calls: the inverse of `save_trainer` (a rank without its own rank file takes rank 0's
    counters, with its RNGs left as they are)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    directory = Path(checkpoint_dir) / TRAINER
    model, optimizer = _stateful(trainer)
    try:
        dcp.load({"model": model, "optimizer": optimizer}, checkpoint_id=str(directory))
        own = directory / f"rank-{trainer.rank}.pt"
        extra = torch.load(own if own.is_file() else directory / "rank-0.pt", weights_only=False)
    except _failures() as error:
        raise CheckpointError(f"checkpoint {checkpoint_dir}: the trainer state cannot be read ({_first_line(error)}); "
                              "delete the directory to use the one before") from error
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=model, optim_state_dict=optimizer)
    trainer.rollouts, trainer.steps = extra["rollouts"], extra["steps"]
    if own.is_file():
        restore_rngs(extra["rngs"])


def load_driver_state(checkpoint: Checkpoint) -> dict:
    from fasync.checkpoint import DRIVER

    try:
        return torch.load(checkpoint.path / DRIVER, weights_only=False)
    except _failures() as error:
        raise CheckpointError(f"checkpoint {checkpoint.path}: {DRIVER} cannot be read ({_first_line(error)}); "
                              "delete the directory to use the one before") from error


def load_policy(cfg, checkpoint: Checkpoint):
    """The policy of `checkpoint`, whole, in one process (DCP reshards whatever wrote it); with its adapters
    under `model.lora`."""
    import torch.distributed.checkpoint as dcp

    from fasync.model import build_model, build_tokenizer
    from fasync.train import lora

    tokenizer = build_tokenizer(cfg.model, cfg.data)
    model = build_model(cfg.model, tokenizer, seed=cfg.train.seed, dtype=torch.float32)
    if cfg.model.lora is not None:
        lora.apply(model, cfg.model.lora)
    state = {"model": model.state_dict()}
    try:
        dcp.load(state, checkpoint_id=str(checkpoint.path / TRAINER))
    except _failures() as error:
        raise CheckpointError(f"checkpoint {checkpoint.path}: the model cannot be read ({_first_line(error)})") \
            from error
    model.load_state_dict(state["model"])
    return model, tokenizer


def export_policy(cfg, checkpoint: Checkpoint, out: Path, merge: bool = False) -> list[str]:
    """Write the checkpoint's policy to `out` in `model.dtype`: a Hugging Face model with `save_pretrained`
    (safetensors) and its tokenizer; the embedded tiny model as model.safetensors with its config in
    fasync_model.json. Under `model.lora`, the adapter as peft writes one (adapter_model.safetensors,
    adapter_config.json), or with `merge` the model with the adapter merged in. Returns the files written."""
    import json

    from safetensors.torch import save_file

    from fasync.model import build_model
    from fasync.model.policy import DTYPES
    from fasync.train import lora

    model, tokenizer = load_policy(cfg, checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.model.lora is not None:
        base = build_model(cfg.model, tokenizer, seed=cfg.train.seed, dtype=torch.float32)
        if not merge:
            adapter = {name: tensor.to(DTYPES[cfg.model.dtype])
                       for name, tensor in lora.adapter_state_dict(model).items()}
            save_file(adapter, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
            lora.peft_config(base, cfg.model.lora).save_pretrained(str(out))
            return sorted(p.name for p in out.iterdir())
        base.load_state_dict(lora.merged_state_dict(model))
        model = base
    model = model.to(DTYPES[cfg.model.dtype])
    if cfg.model.path is not None:
        model.lm.save_pretrained(out, safe_serialization=True)
        tokenizer.hf.save_pretrained(out)
    else:
        save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()},
                  str(out / "model.safetensors"), metadata={"format": "pt"})
        (out / "fasync_model.json").write_text(json.dumps(
            {"model": cfg.model.model_dump(), "data": {"task": cfg.data.task, "length": cfg.data.length},
             "step": checkpoint.step, "weight_version": checkpoint.record.weight_version}, indent=2) + "\n")
    return sorted(p.name for p in out.iterdir())


def export_run(run_dir: Path, step: int | None, out: Path, merge: bool = False) -> tuple[Checkpoint, list[str]]:
    """`fasync export`: the checkpoint of `run_dir` at `step` (None: the newest), exported to `out` (`merge`: a
    LoRA run's adapter merged into the model)."""
    from fasync import checkpoint
    from fasync.config.loader import load_config
    from fasync.errors import ConfigurationError

    found = checkpoint.at_step(run_dir, step)
    loaded = load_config(str(run_dir / "config.yaml"))
    if loaded.config is None:
        raise ConfigurationError(f"{run_dir}/config.yaml: does not load as a fasync config")
    return found, export_policy(loaded.config, found, out, merge)
