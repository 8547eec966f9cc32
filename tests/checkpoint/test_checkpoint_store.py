"""The checkpoint store without a run: a checkpoint appears whole or not at all, the newest `keep` stay,
and a broken one is named with what is wrong (fasync/checkpoint/__init__.py)."""

from __future__ import annotations

import errno
import json
import os

import pytest

from fasync import atomic, checkpoint


def complete(run_dir, step: int, keep: int = 2):
    temp = checkpoint.begin(run_dir, step)
    (temp / checkpoint.DRIVER).write_bytes(b"driver")
    (temp / checkpoint.TRAINER / ".metadata").write_bytes(b"m")
    (temp / checkpoint.TRAINER / "rank-0.pt").write_bytes(b"r")
    (temp / checkpoint.TRAINER / "__0_0.distcp").write_bytes(b"s")
    return checkpoint.commit(temp, checkpoint.CheckpointMeta(step=step, rollout=step, weight_version=step), keep)


def test_only_the_newest_keep_checkpoints_stay_and_no_temp_is_left(tmp_path):
    for step in (2, 4, 6):
        complete(tmp_path, step)
    assert [p.name for p in checkpoint.candidates(tmp_path)] == ["step-00000004", "step-00000006"]
    assert checkpoint.latest(tmp_path).step == 6
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    complete(tmp_path, 2)

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(checkpoint.CheckpointError, match="disk is full.*the previous ones are kept"):
        complete(tmp_path, 4)
    assert [p.name for p in checkpoint.candidates(tmp_path)] == ["step-00000002"]
    assert checkpoint.latest(tmp_path).step == 2
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_a_write_that_died_midway_is_ignored_and_cleared_by_the_next(tmp_path):
    complete(tmp_path, 2)
    checkpoint.begin(tmp_path, 4)  # never committed: the process was killed here
    assert checkpoint.latest(tmp_path).step == 2
    complete(tmp_path, 6)
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


@pytest.mark.parametrize(("damage", "expected"), [
    (lambda cp: (cp / "meta.json").unlink(), "incomplete (no meta.json"),
    (lambda cp: (cp / "meta.json").write_text("{not json"), "meta.json is corrupt"),
    (lambda cp: (cp / "meta.json").write_text(json.dumps({"format": 99, "step": 2})), "format 1"),
    (lambda cp: (cp / "driver.pt").unlink(), "driver.pt is missing"),
    (lambda cp: (cp / "trainer" / ".metadata").unlink(), "trainer/.metadata is missing"),
    (lambda cp: (cp / "trainer" / "__0_0.distcp").unlink(), "the trainer's shards (trainer/*.distcp) are missing"),
])
def test_a_broken_newest_checkpoint_is_named_never_skipped(tmp_path, damage, expected):
    complete(tmp_path, 2, keep=3)
    newest = complete(tmp_path, 4, keep=3)
    damage(newest)
    with pytest.raises(checkpoint.CheckpointError) as raised:
        checkpoint.latest(tmp_path)
    assert expected in str(raised.value) and newest.name in str(raised.value) and "\n" not in str(raised.value)


class Killed(BaseException):
    """The process died at a kill point (what `fasync.killpoints` does with SIGKILL)."""


def test_a_kill_while_a_checkpoint_replaces_one_of_its_step_leaves_a_complete_one(tmp_path, monkeypatch):
    """Issue 32 §5.3: a stop's checkpoint replacing the periodic one of the same step, with `checkpoint.keep: 1`,
    killed between removing the old directory and renaming the new one into place, left no complete checkpoint."""
    complete(tmp_path, 2, keep=1)

    def die(point):
        if point == "checkpoint_rename":
            raise Killed

    monkeypatch.setattr(checkpoint, "kill_point", die)
    with pytest.raises(Killed):
        complete(tmp_path, 2, keep=1)
    found = checkpoint.latest(tmp_path)
    assert found.step == 2 and found.path.name == ".replaced-step-00000002"
    assert checkpoint.at_step(tmp_path, 2).path == found.path
    # The resumed run's next checkpoint of that step takes its place, and the copy aside goes.
    monkeypatch.undo()
    again = complete(tmp_path, 2, keep=1)
    assert [p.name for p in checkpoint.candidates(tmp_path)] == [again.name]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002"]


def test_a_copy_aside_is_ignored_once_its_step_is_in_place(tmp_path):
    complete(tmp_path, 2, keep=1)
    complete(tmp_path, 2, keep=1)
    assert [p.name for p in checkpoint.candidates(tmp_path)] == ["step-00000002"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002"]
