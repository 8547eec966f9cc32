"""Checkpoints of a run: where they live, what marks one complete, which to keep. Torch-free (the CLI
lists and validates checkpoints without it); `fasync.checkpoint.state` writes and reads their contents.

    RUN_DIR/checkpoints/step-00000012/
        meta.json      written last: format, step, rollout, weight version, why it was taken, what it holds
        driver.pt      the driver's state: RNGs, data cursor, ledger, version clock, the mode's groups, engine RNGs
        trainer/       the trainer's model and optimizer through torch.distributed.checkpoint (one shard file per
                       rank under FSDP2), and trainer/rank-R.pt with each rank's counters and RNGs

A checkpoint is assembled in `checkpoints/.tmp-step-…` and renamed into place once meta.json is in it, so a
crash mid-write leaves the previous checkpoints as they were; only the last `checkpoint.keep` are kept. A second
checkpoint of the same step (a stop right after a periodic one) moves the first aside to `.replaced-step-…` before
its own rename and deletes it after: a crash between the two renames leaves that complete copy, which counts as the
step's checkpoint until a `step-…` directory of the same step exists again.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, fields
from pathlib import Path

from fasync.atomic import RunFileError, describe_os_error, write_json_atomic
from fasync.killpoints import kill_point

FORMAT = 1
FORMAT_KEY = "format"
CREATED_KEY = "created"
DIRECTORY = "checkpoints"
META = "meta.json"
DRIVER = "driver.pt"
TRAINER = "trainer"
SHARDS = "*.distcp"
"""The trainer's tensors, as torch.distributed.checkpoint writes them (one file per rank that holds any)."""
_PREFIX = "step-"
_TEMP = ".tmp-"
_REPLACED = ".replaced-"


class CheckpointError(RunFileError):
    """A checkpoint that cannot be used: missing, partial, corrupt or from another format. One line."""


@dataclass(frozen=True)
class CheckpointMeta:
    """meta.json, after its `format` and `created`: what the checkpoint holds and why it was taken. Its keys are
    these fields' names."""

    step: int
    """Optimizer steps taken."""
    rollout: int | None = None
    """The rollout (drain) a resumed run trains first."""
    weight_version: int | None = None
    reason: str | None = None
    """"every", or the outcome of the stop that took it ("finished", "interrupted", "terminated")."""
    finished: bool = False
    mode: str | None = None
    strategy: str | None = None
    trainer_ranks: int | None = None
    stop_reason: str | None = None

    def as_dict(self) -> dict:
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_dict(cls, meta: dict) -> "CheckpointMeta":
        return cls(**{field.name: meta[field.name] for field in fields(cls) if field.name in meta})


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    meta: dict
    """meta.json as written (`record` reads it)."""

    @property
    def record(self) -> CheckpointMeta:
        return CheckpointMeta.from_dict(self.meta)

    @property
    def step(self) -> int:
        return self.record.step

    @property
    def finished(self) -> bool:
        return bool(self.record.finished)


def root(run_dir: Path) -> Path:
    return Path(run_dir) / DIRECTORY


def name_for(step: int) -> str:
    return f"{_PREFIX}{step:08d}"


def _step_of(path: Path) -> int | None:
    name = path.name.removeprefix(_REPLACED)
    digits = name.removeprefix(_PREFIX)
    return int(digits) if name.startswith(_PREFIX) and digits.isdigit() else None


def candidates(run_dir: Path) -> list[Path]:
    """Every step-N directory, oldest first (complete or not), and the copy a replacement moved aside for a step
    that has no step-N directory (the replacing process died between its two renames)."""
    base = root(run_dir)
    if not base.is_dir():
        return []
    found = {p.name: p for p in base.iterdir() if p.is_dir() and _step_of(p) is not None}
    return sorted((p for name, p in found.items()
                   if not name.startswith(_REPLACED) or name.removeprefix(_REPLACED) not in found), key=_step_of)


def validate(path: Path) -> Checkpoint:
    """The checkpoint at `path`, or CheckpointError saying what is wrong with it."""
    where = f"checkpoint {path}"
    if not path.is_dir():
        raise CheckpointError(f"{where}: no such directory")
    meta_file = path / META
    if not meta_file.is_file():
        raise CheckpointError(f"{where}: incomplete (no {META}: its write never finished); delete it to use the "
                              "one before")
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{where}: {META} is corrupt ({error}); delete the directory to use the one before") \
            from error
    if not isinstance(meta, dict) or meta.get(FORMAT_KEY) != FORMAT or not isinstance(meta.get("step"), int):
        raise CheckpointError(f"{where}: {META} is not a fasync checkpoint of format {FORMAT}")
    for part in (DRIVER, f"{TRAINER}/.metadata", f"{TRAINER}/rank-0.pt"):
        if not (path / part).is_file():
            raise CheckpointError(f"{where}: {part} is missing; delete the directory to use the one before")
    if not any((path / TRAINER).glob(SHARDS)):
        raise CheckpointError(f"{where}: the trainer's shards ({TRAINER}/{SHARDS}) are missing; delete the "
                              "directory to use the one before")
    return Checkpoint(path, meta)


def latest(run_dir: Path) -> Checkpoint | None:
    """The newest checkpoint; CheckpointError if the newest directory is partial or corrupt (never a silent
    fallback to an older one: the user decides to lose the steps between them)."""
    found = candidates(run_dir)
    return validate(found[-1]) if found else None


def at_step(run_dir: Path, step: int | None) -> Checkpoint:
    """The checkpoint taken after `step` optimizer steps (None: the newest)."""
    if step is None:
        found = latest(run_dir)
        if found is None:
            raise CheckpointError(f"{run_dir}: holds no checkpoint (the run stopped before its first one)")
        return found
    found = candidates(run_dir)
    path = next((p for p in found if _step_of(p) == step), None)
    if path is None:
        steps = ", ".join(str(_step_of(p)) for p in found) or "none"
        raise CheckpointError(f"{run_dir}: no checkpoint at step {step} (checkpoints at steps: {steps})")
    return validate(path)


def begin(run_dir: Path, step: int) -> Path:
    """A fresh temp directory for the checkpoint of `step` (any left by a crashed write is removed)."""
    base = root(run_dir)
    temp = base / f"{_TEMP}{name_for(step)}"
    try:
        base.mkdir(exist_ok=True)
        for stale in base.glob(f"{_TEMP}*"):
            shutil.rmtree(stale, ignore_errors=True)
        for replaced in base.glob(f"{_REPLACED}*"):
            if (base / replaced.name.removeprefix(_REPLACED)).is_dir():
                shutil.rmtree(replaced, ignore_errors=True)
        (temp / TRAINER).mkdir(parents=True)
    except OSError as error:
        raise CheckpointError(f"cannot write a checkpoint: {describe_os_error(base, error)}") from error
    return temp


def commit(temp: Path, meta: CheckpointMeta, keep: int) -> Path:
    """Write meta.json, rename `temp` into place, and keep only the newest `keep` checkpoints. A checkpoint of the
    same step already there is renamed aside first, and deleted only once `temp` is in place: at every moment one
    complete checkpoint of the step is on disk."""
    final = temp.with_name(temp.name.removeprefix(_TEMP))
    replaced = final.with_name(_REPLACED + final.name)
    written = {FORMAT_KEY: FORMAT, CREATED_KEY: time.strftime("%Y-%m-%dT%H:%M:%S"), **meta.as_dict()}
    try:
        write_json_atomic(temp / META, written)
        if final.exists():  # a second checkpoint at the same step (a stop right after a periodic one)
            shutil.rmtree(replaced, ignore_errors=True)
            os.replace(final, replaced)
        kill_point("checkpoint_rename")
        os.replace(temp, final)
        shutil.rmtree(replaced, ignore_errors=True)
    except (OSError, RunFileError) as error:
        shutil.rmtree(temp, ignore_errors=True)
        detail = describe_os_error(temp, error) if isinstance(error, OSError) else str(error)
        raise CheckpointError(f"cannot write a checkpoint ({detail}); the previous ones are kept") from error
    for old in candidates(temp.parent.parent)[:-max(keep, 1)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def abandon(temp: Path) -> None:
    shutil.rmtree(temp, ignore_errors=True)
