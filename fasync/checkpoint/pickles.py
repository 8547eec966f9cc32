"""What a checkpoint's pickles may hold, how a file that asks for more is refused, and how one that cannot be read
is reported: shared by the torch-free reader of driver.pt (`fasync.checkpoint.driver_file`) and the torch-based
readers of the trainer's files (`fasync.checkpoint.safe_load`, `fasync.checkpoint.state`)."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import numpy as np

from fasync.atomic import describe_os_error
from fasync.checkpoint import CheckpointError


def state_types() -> list:
    """The types every checkpoint state file may hold beyond plain values: counters and numpy's RNG state (a
    uint32 array)."""
    numpy_array = [np.zeros(1).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    return [Counter, *numpy_array]


class RefusedPickle(pickle.UnpicklingError):
    """A checkpoint file asked for a type no fasync checkpoint holds."""


def refusal(path: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"{path}: refers to {what}, which no fasync checkpoint holds, so it is not loaded (loading it could run "
        "code); resume or export only run directories that you or fasync wrote, or delete this checkpoint to use "
        "the one before")


def describe_failure(error: BaseException, path: Path) -> str:
    """One line for what reading or writing the checkpoint file(s) at `path` raised."""
    if isinstance(error, OSError):
        return describe_os_error(error.filename or path, error)
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def unreadable(checkpoint_dir: Path, what: str, problem: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {checkpoint_dir}: {what} cannot be read ({problem}); delete the directory to "
                           "use the one before")
