"""driver.pt, written and read without torch.

What the driver holds between two rollouts is plain data: counters, the ledger, the data cursor, the mode's
groups (token ids and logprobs as lists), Python's and numpy's RNG states, and the engines' sampling streams
as bytes (`fasync.rollout.engine.RolloutEngine.rng_state`). So driver.pt is a pickle that the standard library
writes and reads, and the driver process never imports torch. Importing it cost the driver about 0.2 GiB and
over a second at its first checkpoint, the run's last included, where it set the run's peak memory
(docs/benchmarks.md, "Start-up and footprint").

It is read as data, never as code (`fasync.checkpoint.safe_load` says why): an unpickler that builds only the
types a driver.pt holds (`state_types`, and the drivers' own classes that the caller names) and refuses a file
that asks for anything else, naming the file and what it asked for. A driver.pt written before this format
(torch.save's zip archive) is still read, with torch.load(weights_only=True) and the same types.
"""

from __future__ import annotations

import io
import pickle
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fasync.checkpoint import DRIVER, Checkpoint, CheckpointError
from fasync.checkpoint.pickles import RefusedPickle, describe_failure, refusal, state_types, unreadable


def capture_plain_rngs() -> dict:
    """This process's Python and numpy generators: the driver's RNGs (it never draws from torch, which it does
    not import)."""
    return {"python": random.getstate(), "numpy": np.random.get_state()}


def restore_plain_rngs(state: dict) -> None:
    """What `capture_plain_rngs` captured. A driver.pt written before this format also holds the driver's torch
    generator, which the driver never drew from: it is left alone."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


class _StateUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, allowed: dict[tuple[str, str], type]):
        super().__init__(io.BytesIO(data))
        self._allowed = allowed

    def find_class(self, module: str, name: str):
        found = self._allowed.get((module, name))
        if found is None:
            raise RefusedPickle(f"{module}.{name}")
        return found


def _allowed(types: Sequence) -> dict[tuple[str, str], type]:
    """(module, name) → type for `state_types` and `types`; an item `(type, "module.Name")` also allows a type
    under the name it was pickled with before it moved."""
    allowed = {}
    for item in [*state_types(), *types]:
        kind, name = item if isinstance(item, tuple) else (item, f"{item.__module__}.{item.__qualname__}")
        module, _, qualname = name.rpartition(".")
        allowed[(module, qualname)] = kind
    return allowed


TORCH_SAVE_MAGIC = b"PK\x03\x04"
"""How a driver.pt that torch.save wrote (a zip archive) begins; a pickle begins with its protocol's opcode."""


def save_driver_state(state: dict, path: Path) -> None:
    """driver.pt, as `load_driver_state` reads it back; a full disk raises OSError."""
    # Protocol 4: numpy's RNG state array pickles through `state_types`' reconstructor (protocol 5 would name
    # another function for it).
    Path(path).write_bytes(pickle.dumps(state, protocol=4))


def load_driver_state(checkpoint: Checkpoint, types: Sequence = ()) -> dict:
    """driver.pt of `checkpoint`, with the drivers' own data classes `types` (`fasync.drivers.driver_state_types`)
    allowed. CheckpointError naming the file when it is missing, damaged or asks for anything else."""
    path = checkpoint.path / DRIVER
    try:
        data = path.read_bytes()
        if data.startswith(TORCH_SAVE_MAGIC):
            from fasync.checkpoint.safe_load import load_state

            return load_state(path, types)
        state = _StateUnpickler(data, _allowed(types)).load()
    except RefusedPickle as error:
        raise refusal(path, str(error)) from error
    except CheckpointError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever a missing or damaged file raises, it cannot be read
        raise unreadable(checkpoint.path, DRIVER, describe_failure(error, path)) from error
    if not isinstance(state, dict):
        raise unreadable(checkpoint.path, DRIVER, f"it holds a {type(state).__name__}")
    return state
