"""Reading a checkpoint's files as data, never as code.

driver.pt, trainer/rank-R.pt, DCP's trainer/.metadata and the small values DCP stores inside its shards
(the optimizer's hyperparameters) are pickles, and an unrestricted unpickler runs whatever a pickle asks
for: a crafted run directory could run a command during `fasync export` or `--resume`. So every one of
them is read by a restricted unpickler that builds only the types a fasync checkpoint holds, and a file
that asks for anything else is refused, naming the file and what it asked for:

- driver.pt: a plain pickle read without torch (`fasync.checkpoint.driver_file`), with `Counter`, the numpy
  array of numpy's RNG state and the drivers' own plain data classes allowed, which the caller names
  (`fasync.drivers.driver_state_types`: this package sits below the drivers and knows none of them);
- rank-R.pt, and a driver.pt written before that format: `torch.load(weights_only=True)` with the same types
  allowed (`load_state`);
- trainer/.metadata: DCP reads it with `pickle.load`, so it is unpickled first with only DCP's metadata
  records allowed (`_METADATA_TYPES`), before DCP reads it;
- DCP's stored values (`torch.load(weights_only=False)` in DCP's planner): each is unpickled first with
  `weights_only=True`, then handed to DCP.

A pickle that the restricted unpickler reads in full holds nothing but those types and plain values, so
DCP's own read of the same bytes builds the same data.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from fasync.checkpoint import CheckpointError
from fasync.checkpoint.pickles import RefusedPickle, refusal, state_types

_METADATA_TYPES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                              "TensorStorageMetadata", "ChunkStorageMetadata",
                                              "BytesStorageMetadata", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"} | {name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}
"""What DCP's .metadata pickles: its records, tensor sizes, dtypes and layouts, and the checkpoint's path."""


def load_state(path: Path, types: Sequence = ()) -> dict:
    """A rank-R.pt (or a driver.pt that torch.save wrote), read with only `state_types` and `types` allowed.
    Raises CheckpointError naming the file when it asks for anything else; OSError and unpickling errors of a
    damaged file as they are."""
    with torch.serialization.safe_globals([*state_types(), *types]):
        try:
            return torch.load(path, weights_only=True)
        except pickle.UnpicklingError as error:
            unsafe = _unsafe_globals(path)
            if unsafe:
                raise refusal(path, ", ".join(unsafe)) from error
            raise


def _unsafe_globals(path: Path) -> list[str]:
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 - a file too damaged to list is reported as damaged by the caller
        return []


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if name in _METADATA_TYPES.get(module, ()):
            return super().find_class(module, name)
        raise RefusedPickle(f"{module}.{name}")


def check_metadata(directory: Path) -> None:
    """Unpickle DCP's `directory/.metadata` with only `_METADATA_TYPES` allowed, before DCP unpickles it
    without limits. Raises CheckpointError naming the file when it asks for anything else or is damaged (DCP
    itself would only log a traceback and say "metadata is None")."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = directory / ".metadata"
    try:
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except RefusedPickle as error:
        raise refusal(path, str(error)) from error
    except OSError:
        raise
    except Exception as error:  # noqa: BLE001 - whatever a damaged pickle raises, it is a damaged file
        raise _damaged(path, f"{type(error).__name__}: {error}") from error
    if not isinstance(metadata, Metadata):
        raise _damaged(path, f"it holds a {type(metadata).__name__}")


def _damaged(path: Path, problem: str) -> CheckpointError:
    return CheckpointError(f"{path}: damaged, not the checkpoint's DCP metadata ({problem}); delete the checkpoint "
                           "directory to use the one before")


class SafePlanner(DefaultLoadPlanner):
    """DCP's load planner, which unpickles a value stored in `directory` only after `torch.load(weights_only=True)`
    read it."""

    def __init__(self, directory: Path):
        super().__init__()
        self.directory = directory

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)
        except pickle.UnpicklingError as error:
            raise CheckpointError(f"{self.directory}: the value {read_item.dest_index.fqn} stored there is not plain "
                                  "data, so it is not loaded (loading it could run code); resume or export only run "
                                  "directories that you or fasync wrote") from error
        value.seek(0)
        super().load_bytes(read_item, value)


def dcp_load(state: dict, directory: Path) -> None:
    """`torch.distributed.checkpoint.load` of `state` from `directory`, its .metadata checked first
    (`check_metadata`) and its stored values through `SafePlanner`."""
    import torch.distributed.checkpoint as dcp

    check_metadata(directory)
    dcp.load(state, checkpoint_id=str(directory), planner=SafePlanner(directory))
