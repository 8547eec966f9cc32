"""A checkpoint's files read as data, never as code (fasync/checkpoint/safe_load.py), and `fasync export`:
a crafted driver.pt, rank file, DCP .metadata or stored value is refused with one line naming the file and
runs nothing; an honest checkpoint of every mode loads (including async ones written before RolloutBatch
moved, and driver.pt files that torch.save wrote); driver.pt is written and read without importing torch, and
an engine's sampling stream goes through it as bytes; an export never overwrites a directory that is not an earlier export, lists only what it wrote and
says so when the disk is full; a damaged .metadata and a full disk under the trainer's checkpoint are one
line each."""

from __future__ import annotations

import errno
import os
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
import yaml
from cli_runs import REPO, fasync
from mounts import fasync_on_a_full_disk, python_on_a_full_disk
from sections import tiny_sections

from fasync import checkpoint
from fasync.checkpoint.driver_file import capture_plain_rngs, load_driver_state, save_driver_state
from fasync.checkpoint.safe_load import dcp_load, load_state
from fasync.checkpoint.state import capture_rngs
from fasync.drivers import driver_state_types
from fasync.drivers.generation import RolloutBatch
from fasync.metrics.signal import LearningSignal
from fasync.rollout.groups import PromptGroup
from fasync.rollout.types import Generation, GroupId, Sample


class Payload:
    """What an attacker puts into a pickle: unpickling it runs `touch MARKER`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def driver_state() -> dict:
    """What driver.pt holds beyond plain values: prompt groups (async's generated rollouts, fully_async's
    rollouter), the learning signal, every RNG and the engines' generator states."""
    group = PromptGroup(GroupId(3, 1), "123", "321", [Generation(7, [1, 2], [3], [-0.5], [0], "stop")],
                        [Sample(GroupId(3, 1), [1, 2], [3], [-0.5], [0], 1.0, "321", "3", "stop", 0.25)], 3)
    signal = LearningSignal()
    signal.warned.add("entropy_collapse_streak")
    return {"step": 2, "signal": signal, "rngs": capture_plain_rngs(),
            "engine_rngs": [torch.Generator().get_state().numpy().tobytes()],
            "factory": {"rng": random.Random(1).getstate(), "draws": 4},
            "mode": {"generated": [(2, RolloutBatch([group], 0.5, 1, Counter(stale=2)))],
                     "rollouter": {"waiting": [group], "in_flight": [], "retry": []}}}


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run directory with one checkpoint, written as a run writes it, without starting Ray."""
    from fasync.config.schema import FasyncConfig
    from fasync.model import build_model, build_tokenizer

    run = tmp_path / "run"
    run.mkdir()
    raw = tiny_sections()
    (run / "config.yaml").write_text(yaml.safe_dump(raw))
    cfg = FasyncConfig.model_validate(raw)
    model = build_model(cfg.model, build_tokenizer(cfg.model, cfg.data), seed=0, dtype=torch.float32)
    temp = checkpoint.begin(run, 2)
    dcp.save({"model": model.state_dict(), "hyper": {"lr": 0.1, "betas": (0.9, 0.99)}},
             checkpoint_id=str(temp / checkpoint.TRAINER))
    torch.save({"rollouts": 1, "steps": 2, "rngs": capture_rngs()}, temp / checkpoint.TRAINER / "rank-0.pt")
    save_driver_state(driver_state(), temp / checkpoint.DRIVER)
    checkpoint.commit(temp, checkpoint.CheckpointMeta(step=2, rollout=1, weight_version=1), keep=2)
    return run


def newest(run: Path) -> Path:
    return checkpoint.latest(run).path


def test_an_honest_checkpoint_of_every_mode_loads(run_dir):
    state = load_driver_state(checkpoint.latest(run_dir), driver_state_types())
    expected = driver_state()
    assert state["mode"] == expected["mode"] and state["factory"] == expected["factory"]
    assert state["signal"].warned == {"entropy_collapse_streak"}
    np.random.set_state(state["rngs"]["numpy"])
    assert load_state(newest(run_dir) / "trainer" / "rank-0.pt")["steps"] == 2
    hyper = {"hyper": {"lr": 0.0, "betas": (0.0, 0.0)}}
    dcp_load(hyper, newest(run_dir) / "trainer")
    assert hyper == {"hyper": {"lr": 0.1, "betas": (0.9, 0.99)}}


@pytest.mark.parametrize("save", [save_driver_state, torch.save], ids=["plain pickle", "torch.save (before)"])
def test_an_async_driver_state_pickled_before_rolloutbatch_moved_still_loads(run_dir, monkeypatch, save):
    monkeypatch.setattr(RolloutBatch, "__module__", "fasync.drivers.common")
    save(driver_state(), newest(run_dir) / "driver.pt")
    monkeypatch.undo()
    assert load_driver_state(checkpoint.latest(run_dir), driver_state_types())["mode"] == driver_state()["mode"]


def test_a_driver_state_written_by_torch_save_before_the_plain_format_still_loads(run_dir):
    """driver.pt of a checkpoint taken before driver.pt became a plain pickle: torch.save's archive, with the
    driver's torch generator and the engines' generator states as tensors, as they were then."""
    old = {**driver_state(), "rngs": capture_rngs(), "engine_rngs": [torch.Generator().manual_seed(5).get_state()]}
    torch.save(old, newest(run_dir) / "driver.pt")
    state = load_driver_state(checkpoint.latest(run_dir), driver_state_types())
    assert state["mode"] == driver_state()["mode"] and torch.equal(state["engine_rngs"][0], old["engine_rngs"][0])


def test_the_driver_state_and_its_load_never_import_torch(tmp_path):
    """The driver process never imports torch (0.2 GiB and over a second): driver.pt is written and read back
    in a fresh process that has not imported it, with an engine's sampling stream as the engines now send it."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from fasync.checkpoint import Checkpoint\n"
        "from fasync.checkpoint.driver_file import capture_plain_rngs, load_driver_state, save_driver_state\n"
        "from fasync.drivers import driver_state_types\n"
        "path = Path(sys.argv[1])\n"
        "save_driver_state({'step': 3, 'rngs': capture_plain_rngs(), 'engine_rngs': [bytes(range(16))]},"
        " path / 'driver.pt')\n"
        "state = load_driver_state(Checkpoint(path, {}), driver_state_types())\n"
        "print(state['step'], state['engine_rngs'][0] == bytes(range(16)), 'torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "True", "False"]


def test_an_engine_sampling_stream_goes_through_driver_pt_as_bytes_and_comes_back(tmp_path):
    from fasync.rollout.hf_engine import HFEngine

    engine = HFEngine(torch.nn.Linear(1, 1), pad_id=0, seed=3)
    saved = engine.rng_state()
    expected = torch.rand(4, generator=engine.generator)
    engine.set_rng_state(saved)
    assert isinstance(saved, bytes) and torch.equal(torch.rand(4, generator=engine.generator), expected)


@pytest.mark.parametrize("part, save", [("driver.pt", save_driver_state), ("driver.pt", torch.save),
                                        ("trainer/rank-0.pt", torch.save)],
                         ids=["driver.pt", "driver.pt by torch.save (before)", "trainer/rank-0.pt"])
def test_a_crafted_state_file_is_refused_and_runs_nothing(run_dir, tmp_path, part, save):
    marker = tmp_path / "ran"
    path = newest(run_dir) / part
    save({"step": 2, "rngs": Payload(marker)}, path)
    with pytest.raises(checkpoint.CheckpointError) as raised:
        if part == "driver.pt":
            load_driver_state(checkpoint.latest(run_dir), driver_state_types())
        else:
            load_state(path)
    message = str(raised.value)
    assert not marker.exists()
    assert str(path) in message and "system" in message and "could run code" in message and "\n" not in message


def test_a_crafted_dcp_metadata_is_refused_by_export_and_runs_nothing(run_dir, tmp_path):
    import pickle

    marker = tmp_path / "ran"
    (newest(run_dir) / "trainer" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    result = fasync("export", str(run_dir), str(tmp_path / "out"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert not marker.exists() and "Traceback" not in result.stderr
    assert "trainer/.metadata: refers to posix.system" in result.stderr and "could run code" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_crafted_value_stored_in_the_trainer_checkpoint_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    dcp.save({"hyper": Payload(marker)}, checkpoint_id=str(tmp_path / "trainer"))
    assert not marker.exists()
    with pytest.raises(BaseException) as raised:
        dcp_load({"hyper": None}, tmp_path / "trainer")
    assert not marker.exists() and "could run code" in str(raised.value)
    assert f"{tmp_path / 'trainer'}: the value hyper stored there is not plain data" in str(raised.value)


@pytest.mark.parametrize("content", [b"garbage", b"", b"\x80\x04K\x01."])
def test_a_damaged_dcp_metadata_is_one_line_on_export(run_dir, tmp_path, content):
    (newest(run_dir) / "trainer" / ".metadata").write_bytes(content)
    result = fasync("export", str(run_dir), str(tmp_path / "out"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "trainer/.metadata: damaged" in result.stderr, result.stderr


def test_export_refuses_a_directory_that_is_not_an_export_and_lists_only_what_it_wrote(run_dir, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"the user's own model")
    refused = fasync("export", str(run_dir), str(out))
    assert refused.returncode == 1 and "is not empty and holds no fasync export" in refused.stderr
    assert "--force" in refused.stderr and (out / "model.safetensors").read_bytes() == b"the user's own model"

    (out / "notes.txt").write_text("kept")
    forced = fasync("export", str(run_dir), str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.strip().endswith(": fasync_model.json, model.safetensors")
    assert (out / "notes.txt").read_text() == "kept" and not list(tmp_path.glob(".*export*"))

    again = fasync("export", str(run_dir), str(out))  # an earlier export is written over without --force
    assert again.returncode == 0 and "notes.txt" not in again.stdout


def test_export_to_a_file_is_one_line(run_dir, tmp_path):
    (tmp_path / "file").write_text("x")
    result = fasync("export", str(run_dir), str(tmp_path / "file"))
    assert result.returncode == 1 and "is a file, not a directory" in result.stderr and "Traceback" not in result.stderr


def test_export_onto_a_full_disk_is_one_line_and_leaves_nothing(run_dir, tmp_path):
    disk = tmp_path / "disk"
    result = fasync_on_a_full_disk(disk, "export", str(run_dir), str(disk / "out"), cwd=REPO)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no space left on device" in result.stderr and str(disk) in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


_SAVE_ONTO = """
import sys
from pathlib import Path

import torch

from fasync.checkpoint import CheckpointError
from fasync.checkpoint.state import save_trainer


class Trainer:
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters())
    rank, rollouts, steps = 0, 0, 0


(Path(sys.argv[1]) / "trainer").mkdir()
try:
    save_trainer(Trainer(), Path(sys.argv[1]))
except CheckpointError as error:
    print(error)
"""


def test_a_full_disk_under_the_trainer_checkpoint_says_so_with_the_path(tmp_path):
    disk = tmp_path / "disk"
    result = python_on_a_full_disk(disk, "-c", _SAVE_ONTO, str(disk), cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"cannot write the trainer's checkpoint to {disk / 'trainer'} (")
    assert "no space left on device" in result.stdout and "CheckpointException" not in result.stdout
    assert result.stdout.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("save", ["driver.pt", "rank-R.pt"])
def test_a_state_file_written_onto_a_full_disk_raises_the_os_error(save):
    from fasync.checkpoint.state import save_state

    with pytest.raises(OSError) as raised:
        (save_driver_state if save == "driver.pt" else save_state)(driver_state(), Path("/dev/full"))
    assert raised.value.errno == errno.ENOSPC
