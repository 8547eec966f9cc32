"""What a checkpoint's pickles may hold, and how a file that asks for more is refused: shared by the torch-free
reader of driver.pt (`fasync.checkpoint.driver_file`) and the torch-based readers of the trainer's files
(`fasync.checkpoint.safe_load`)."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import numpy as np

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
