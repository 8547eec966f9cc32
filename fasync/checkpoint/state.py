"""What goes into a checkpoint and comes back out: the trainer's model and optimizer through
torch.distributed.checkpoint (DCP), every RNG, and the policy exported for use elsewhere.

DCP is used for every strategy. Under FSDP2 each rank writes its own shards of the fp32 master weights and
of the AdamW state (no gather to one rank, no whole-model copy in any process); DCP reshards on load, so a
checkpoint also loads into a different number of ranks, or whole into one process for `fasync export`.
Under ddp the state is replicated and DCP writes one copy.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from fasync.atomic import RunFileError, run_file_error
from fasync.checkpoint import TRAINER, Checkpoint, CheckpointError
from fasync.checkpoint.driver_file import capture_plain_rngs, restore_plain_rngs
from fasync.checkpoint.pickles import describe_failure, unreadable
from fasync.checkpoint.safe_load import check_metadata, dcp_load, load_state


def capture_rngs() -> dict:
    """This process's python, numpy and torch (and CUDA) generators."""
    state = {**capture_plain_rngs(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rngs(state: dict) -> None:
    restore_plain_rngs(state)
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


def _cause(error: BaseException) -> BaseException:
    """What went wrong beneath DCP's CheckpointException, which holds each rank's exception with its traceback
    and says only "CheckpointException ranks:dict_keys([0])" on its first line: the first rank's exception,
    followed down its causes to the OSError (a full disk) or CheckpointError (a refused file) a user can act on."""
    from torch.distributed.checkpoint.api import CheckpointException

    seen: set[int] = set()
    while id(error) not in seen and not isinstance(error, (OSError, CheckpointError)):
        seen.add(id(error))
        if isinstance(error, CheckpointException) and error.failures:
            failure = next(iter(error.failures.values()))  # (exception, traceback) per rank
            error = failure[0] if isinstance(failure, tuple) else failure
        elif error.__cause__ is not None:
            error = error.__cause__
        else:
            break
    return error


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
        save_state({"rollouts": trainer.rollouts, "steps": trainer.steps, "rngs": capture_rngs()},
                   directory / f"rank-{trainer.rank}.pt")
    except _failures() as error:
        cause = _cause(error)
        if not isinstance(cause, OSError):
            cause = _full_disk(directory) or cause
        raise CheckpointError(f"cannot write the trainer's checkpoint to {directory} "
                              f"({describe_failure(cause, directory)}); the previous checkpoints are kept") from error


_FULL_BELOW = 1 << 20
"""Free bytes under which a failed write is put down to a full disk (`_full_disk`)."""


def _full_disk(directory: Path) -> OSError | None:
    """torch.save, which DCP writes its shards with, reports a full disk only as a short write ("unexpected
    pos"), without the OSError: a write that failed where (almost) no space is left is taken as ENOSPC."""
    import errno
    import os
    import shutil

    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory)) if free < _FULL_BELOW else None


def save_state(value: dict, path: Path) -> None:
    """A rank-R.pt, as `load_state` reads it back. Serialized in memory and written by Python, so
    that a full disk raises OSError (torch.save's own writer says only "unexpected pos")."""
    import io

    buffer = io.BytesIO()
    torch.save(value, buffer)
    Path(path).write_bytes(buffer.getvalue())


def _unreadable(checkpoint_dir: Path, what: str, error: BaseException) -> CheckpointError:
    """A checkpoint file that cannot be read: a refused one as it says, any other named with its problem."""
    cause = _cause(error)
    if isinstance(cause, CheckpointError):
        return cause
    return unreadable(checkpoint_dir, what, describe_failure(cause, checkpoint_dir))


def load_trainer(trainer, checkpoint_dir: Path) -> None:
    """Every rank calls: the inverse of `save_trainer` (a rank without its own rank file takes rank 0's
    counters, with its RNGs left as they are)."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    directory = Path(checkpoint_dir) / TRAINER
    model, optimizer = _stateful(trainer)
    try:
        dcp_load({"model": model, "optimizer": optimizer}, directory)
        own = directory / f"rank-{trainer.rank}.pt"
        extra = load_state(own if own.is_file() else directory / "rank-0.pt")
    except _failures() as error:
        raise _unreadable(checkpoint_dir, "the trainer state", error) from error
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=model, optim_state_dict=optimizer)
    trainer.rollouts, trainer.steps = extra["rollouts"], extra["steps"]
    if own.is_file():
        restore_rngs(extra["rngs"])


def check_trainer_files(checkpoint: Checkpoint) -> None:
    """Read the trainer's small pickles (DCP's .metadata and every rank-R.pt) as `load_trainer` will, so that a
    crafted or damaged one is refused before a resume starts Ray and the actors. The shards' tensors are left to
    `load_trainer`: reading them here would cost as much as the load itself."""
    directory = checkpoint.path / TRAINER
    try:
        check_metadata(directory)
        for rank_file in sorted(directory.glob("rank-*.pt")):
            load_state(rank_file)
    except _failures() as error:
        raise _unreadable(checkpoint.path, "the trainer state", error) from error


def load_policy(cfg, checkpoint: Checkpoint):
    """The policy of `checkpoint`, whole, in one process (DCP reshards whatever wrote it); with its adapters
    under `model.lora`."""
    from fasync.model import build_model, build_tokenizer, lora

    tokenizer = build_tokenizer(cfg.model, cfg.data, chat=cfg.rollout.agentic)
    model = build_model(cfg.model, tokenizer, seed=cfg.train.seed, dtype=torch.float32)
    if cfg.model.lora is not None:
        lora.apply(model, cfg.model.lora, cfg.train.seed)
    state = {"model": model.state_dict()}
    try:
        dcp_load(state, checkpoint.path / TRAINER)
    except _failures() as error:
        raise _unreadable(checkpoint.path, "the model", error) from error
    model.load_state_dict(state["model"])
    return model, tokenizer


EXPORT_RECORD = "fasync_model.json"
"""Written into every export: the model section, the task, the step and the weight version it came from. A
directory holding it is a fasync export, which a later export may write into."""

ADAPTER_WEIGHTS = "adapter_model.safetensors"
"""A LoRA run's adapter as peft names its weights file (beside peft's adapter_config.json)."""


def export_policy(cfg, checkpoint: Checkpoint, out: Path, force: bool = False, merge: bool = False) -> list[str]:
    """Write the checkpoint's policy to `out` in `model.dtype`: a Hugging Face model with `save_pretrained`
    (safetensors) and its tokenizer; the embedded tiny model as model.safetensors; and `EXPORT_RECORD`. Under
    `model.lora`, the adapter as peft writes one (`ADAPTER_WEIGHTS`, adapter_config.json) instead of the model,
    or with `merge` the model with the adapter merged in. `out` must be new, empty or an earlier export (any
    directory with `force`). The files are written beside `out` first and moved in once all are written, so a
    failed export (a full disk) leaves `out` as it was. Returns the files written; RunFileError when `out` is
    refused or cannot be written."""
    import os
    import shutil

    _check_export_target(out, force)
    model, tokenizer = load_policy(cfg, checkpoint)
    staging = out.parent / f".{out.name}.tmp-export-{os.getpid()}"
    try:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        _write_policy(cfg, checkpoint, model, tokenizer, staging, merge)
        written = sorted(path.name for path in staging.iterdir())
        out.mkdir(exist_ok=True)
        for name in written:
            os.replace(staging / name, out / name)
    except OSError as error:
        raise run_file_error(error.filename or out, error, "write") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


def _check_export_target(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise RunFileError(f"{out}: is a file, not a directory; name a directory to export to")
    if force or not out.is_dir() or (out / EXPORT_RECORD).is_file() or not any(out.iterdir()):
        return
    raise RunFileError(f"{out}: is not empty and holds no fasync export (no {EXPORT_RECORD}), so nothing is "
                       "written to it; name a new or empty directory, or pass --force to write into it (its files "
                       "of the same names are replaced)")


def _write_policy(cfg, checkpoint: Checkpoint, model, tokenizer, out: Path, merge: bool) -> None:
    import json

    from safetensors.torch import save

    from fasync.model import build_model, lora
    from fasync.model.policy import DTYPES

    dtype = DTYPES[cfg.model.dtype]
    if cfg.model.lora is not None:
        base = build_model(cfg.model, tokenizer, seed=cfg.train.seed, dtype=torch.float32)
        if merge:
            base.load_state_dict(lora.merged_state_dict(model))
            _write_model(cfg, base.to(dtype), tokenizer, out)
        else:
            adapter = {name: tensor.to(dtype) for name, tensor in lora.adapter_state_dict(model).items()}
            # Serialized here and written by Python, so that a full disk raises OSError like every other write.
            (out / ADAPTER_WEIGHTS).write_bytes(save(adapter, metadata={"format": "pt"}))
            lora.peft_config(base, cfg.model.lora).save_pretrained(str(out))
    else:
        _write_model(cfg, model.to(dtype), tokenizer, out)
    (out / EXPORT_RECORD).write_text(json.dumps(
        {"model": cfg.model.model_dump(), "data": {"task": cfg.data.task, "length": cfg.data.length},
         "step": checkpoint.step, "weight_version": checkpoint.record.weight_version}, indent=2) + "\n")


def _write_model(cfg, model, tokenizer, out: Path) -> None:
    from safetensors.torch import save

    if cfg.model.path is not None:
        with _safetensors_os_errors():
            model.lm.save_pretrained(out, safe_serialization=True)
        tokenizer.hf.save_pretrained(out)
    else:
        # Serialized here and written by Python, so that a full disk raises OSError like every other write.
        (out / "model.safetensors").write_bytes(save(
            {name: tensor.contiguous() for name, tensor in model.state_dict().items()}, metadata={"format": "pt"}))


@contextmanager
def _safetensors_os_errors():
    """safetensors writes in Rust and reports a failed write (a full disk) as a SafetensorError whose message
    ends with the OS error's number: raised here as that OSError."""
    import errno
    import os
    import re

    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as error:
        number = re.search(r"os error (\d+)", str(error))
        if number is None:
            raise
        code = int(number.group(1))
        raise OSError(code, os.strerror(code) if code in errno.errorcode else str(error)) from error


def export_run(run_dir: Path, step: int | None, out: Path, force: bool = False,
               merge: bool = False) -> tuple[Checkpoint, list[str]]:
    """`fasync export`: the checkpoint of `run_dir` at `step` (None: the newest), exported to `out` (`merge`: a
    LoRA run's adapter merged into the model)."""
    from fasync import checkpoint
    from fasync.config.loader import load_config
    from fasync.errors import ConfigurationError

    found = checkpoint.at_step(run_dir, step)
    loaded = load_config(str(run_dir / "config.yaml"))
    if loaded.config is None:
        raise ConfigurationError(f"{run_dir}/config.yaml: does not load as a fasync config")
    return found, export_policy(loaded.config, found, out, force, merge)
