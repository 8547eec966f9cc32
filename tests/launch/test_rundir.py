"""The run directory (issue 19 §1): the marker that makes it a fasync run, the lock that keeps a second run
out, and one clear line for every way the filesystem can refuse. None of these start Ray."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import fasync, write_config
from paths import REPO

from fasync import atomic
from fasync.atomic import JsonlAppender, RunFileError, read_jsonl, write_json_atomic
from fasync.launch import rundir
from fasync.metrics.writer import MetricsWriter, read_metrics


def no_traceback(result) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr


def test_a_second_run_on_a_locked_run_directory_is_refused_and_moves_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / rundir.MARKER).write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / rundir.LOCK).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
        result = fasync("train", str(write_config(tmp_path)), "--run-dir", str(out))
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"another fasync run (pid {holder.pid}" in result.stdout
    no_traceback(result)
    assert (out / "metrics.jsonl").read_text() == '{"step": 0}\n'
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("out")] == ["out"]


def test_a_stale_lock_is_taken_over_and_the_earlier_run_moved_aside(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / rundir.MARKER).write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / rundir.LOCK).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    said = []
    lock = rundir.prepare_new(out, tmp_path, said.append)
    try:
        assert any("stale lock" in line and str(dead.pid) in line for line in said), said
        assert any("was moved to" in line for line in said)
        assert json.loads((out / rundir.LOCK).read_text())["pid"] == os.getpid()
        assert rundir.is_run(out) and sorted(p.name for p in out.iterdir()) == [rundir.LOCK, rundir.MARKER]
        kept = [p for p in tmp_path.iterdir() if p.name.startswith("out-")]
        assert len(kept) == 1 and (kept[0] / "metrics.jsonl").read_text() == '{"step": 0}\n'
        assert not (kept[0] / rundir.LOCK).exists()
        # The new run's marker names the directory of the config it started from and the working directory;
        # a run of a release that did not record them (the marker "{}") has neither.
        assert rundir.recorded_dir(out, "config_dir") == tmp_path.resolve()
        assert rundir.recorded_dir(out, "cwd") == Path.cwd()
        assert rundir.recorded_dir(kept[0], "config_dir") is None and rundir.recorded_dir(kept[0], "cwd") is None
    finally:
        lock.release()
    assert not (out / rundir.LOCK).exists()


def test_two_locks_on_one_directory_exclude_each_other(tmp_path):
    first = rundir.RunLock(tmp_path)
    first.acquire()
    with pytest.raises(RunFileError, match="another fasync run"):
        rundir.RunLock(tmp_path).acquire()
    first.release()
    rundir.RunLock(tmp_path).acquire()


def test_a_directory_that_is_not_a_fasync_run_is_never_moved(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.md").write_text("mine")
    result = fasync("train", str(write_config(tmp_path)), "--run-dir", str(project))
    assert result.returncode == 1
    assert "holds no fasync run" in result.stdout and "moved" not in result.stdout
    no_traceback(result)
    assert (project / "notes.md").read_text() == "mine" and sorted(p.name for p in project.iterdir()) == ["notes.md"]


def test_run_dir_dot_is_the_current_directory(tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    path = rundir.choose(None, "run.yaml", ".")
    assert path == here
    lock = rundir.prepare_new(path, tmp_path, lambda line: None)
    lock.release()
    assert rundir.is_run(here)


def test_run_dir_dot_in_a_project_directory_is_refused_not_a_crash(tmp_path):
    config = write_config(tmp_path)
    result = fasync("train", str(config), "--run-dir", ".", cwd=tmp_path,
                    env_extra={"PYTHONPATH": str(REPO)})
    assert result.returncode == 1
    assert "holds no fasync run" in result.stdout and "empty name" not in result.stdout + result.stderr
    no_traceback(result)
    assert config.exists()


def test_a_run_dir_that_is_a_regular_file_is_one_line(tmp_path):
    target = tmp_path / "out"
    target.write_text("not a directory")
    result = fasync("train", str(write_config(tmp_path)), "--run-dir", str(target))
    assert result.returncode == 1
    assert f"{target}: is a file, not a directory" in result.stdout
    no_traceback(result)
    assert target.read_text() == "not a directory"


@pytest.mark.parametrize(("code", "words"), [(errno.EROFS, "read-only"), (errno.ENOSPC, "disk is full"),
                                             (errno.EACCES, "permission denied")])
def test_a_run_dir_the_filesystem_refuses_is_one_line_naming_the_path(tmp_path, monkeypatch, code, words):
    def refuse(self, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(RunFileError) as raised:
        rundir.prepare_new(tmp_path / "out", tmp_path, lambda line: None)
    message = str(raised.value)
    assert "\n" not in message and str(tmp_path / "out") in message and words in message


def test_a_busy_mount_point_is_not_moved_and_says_so(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / rundir.MARKER).write_text("{}")
    (out / "metrics.jsonl").write_text("{}\n")

    def busy(self, target):
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(self))

    monkeypatch.setattr(Path, "rename", busy)
    with pytest.raises(RunFileError, match="busy") as raised:
        rundir.prepare_new(out, tmp_path, lambda line: None)
    assert "\n" not in str(raised.value) and str(out) in str(raised.value)
    assert not (out / rundir.LOCK).exists()
    assert (out / "metrics.jsonl").exists()


def test_resume_of_a_directory_that_is_not_a_run_is_a_clear_error(tmp_path):
    (tmp_path / "notes.md").write_text("mine")
    result = fasync("train", "--resume", str(tmp_path))
    assert result.returncode == 2 and "not a fasync run directory" in result.stdout
    result = fasync("train", "--resume", str(tmp_path / "missing"))
    assert result.returncode == 2 and "no such directory" in result.stdout
    no_traceback(result)


def test_resume_of_a_run_on_a_read_only_mount_holding_a_stale_lock_is_one_line(tmp_path):
    from cli_runs import REPO
    from mounts import fasync_on_a_read_only_mount

    out = tmp_path / "out"
    out.mkdir()
    (out / rundir.MARKER).write_text("{}")
    (out / rundir.LOCK).write_text(json.dumps({"pid": 2 ** 22 + 1, "host": socket.gethostname(), "started": "x"}))
    result = fasync_on_a_read_only_mount(out, "train", "--resume", str(out), cwd=REPO)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == (f"fasync train: cannot lock the run directory: {out / rundir.LOCK}: the filesystem is "
                             "read-only; copy the run directory somewhere writable and use the copy\n")
    no_traceback(result)


def _short_writes(monkeypatch, fail_after: int):
    """os.write that writes half of what it is given, and fails with ENOSPC after `fail_after` calls."""
    calls = {"n": 0}
    real = os.write

    def write(fd, data):
        calls["n"] += 1
        if calls["n"] > fail_after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data[: max(1, len(data) // 2)])

    monkeypatch.setattr(atomic.os, "write", write)


def test_a_full_disk_mid_line_cuts_metrics_back_to_the_last_whole_line(tmp_path, monkeypatch):
    writer = MetricsWriter(tmp_path, "sync")
    writer.write({"step": 0, "rollout": 0, "loss": 0.5})
    _short_writes(monkeypatch, fail_after=2)  # half the line, a quarter, then the disk is full
    with pytest.raises(RunFileError) as raised:
        writer.write({"step": 1, "rollout": 0, "loss": 0.25})
    assert "disk is full" in str(raised.value) and "metrics.jsonl" in str(raised.value)
    assert "\n" not in str(raised.value)
    text = (tmp_path / "metrics.jsonl").read_text()
    assert text.endswith("\n") and [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0]


def test_short_writes_that_succeed_still_write_whole_lines(tmp_path, monkeypatch):
    _short_writes(monkeypatch, fail_after=10_000)
    appender = JsonlAppender(tmp_path / "x.jsonl")
    for step in range(3):
        appender.append({"step": step, "text": "y" * 100})
    assert [r["step"] for r in read_jsonl(tmp_path / "x.jsonl")] == [0, 1, 2]


def test_a_state_file_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    summary = tmp_path / "summary.json"
    write_json_atomic(summary, {"outcome": "finished"})

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(RunFileError, match="disk is full"):
        write_json_atomic(summary, {"outcome": "interrupted"})
    assert json.loads(summary.read_text()) == {"outcome": "finished"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


# Contenders for one lock, each in its own process. Each slows the step the race is about, so that the
# contenders overlap there on every trial rather than by chance: deciding a lock is stale (`_stale`), or
# marking a new run directory after locking it (`_mark`).
CONTENDER = """
import json, sys, time
from pathlib import Path
from fasync.launch import rundir

task, start, slow, dirs = sys.argv[1], float(sys.argv[2]), sys.argv[3], [Path(d) for d in sys.argv[4:]]
step = getattr(rundir.RunLock, slow) if slow == "_stale" else getattr(rundir, slow)
def slowed(*args):
    time.sleep(0.1)
    return step(*args)
if slow == "_stale":
    rundir.RunLock._stale = staticmethod(slowed)
else:
    rundir._mark = slowed
results = []
for index, directory in enumerate(dirs):
    while time.time() < start + 0.3 * index:
        time.sleep(0.001)
    try:
        if task == "lock":
            rundir.RunLock(directory).acquire()  # held until this process ends
        else:
            rundir.prepare_new(directory, directory.parent, lambda line: None)
        results.append("locked")
    except rundir.RunFileError as error:
        results.append(str(error))
print(json.dumps(results))
"""


def race(task: str, slow: str, dirs: list[Path], contenders: int = 3) -> list[list[str]]:
    """Each directory's outcomes, one per contender: "locked" or the message it was refused with."""
    import time

    start = time.time() + 2.0  # every contender has imported fasync by then
    processes = [subprocess.Popen([sys.executable, "-c", CONTENDER, task, str(start), slow, *map(str, dirs)],
                                  stdout=subprocess.PIPE, text=True) for _ in range(contenders)]
    outcomes = [json.loads(process.communicate(timeout=120)[0]) for process in processes]
    return [list(per_directory) for per_directory in zip(*outcomes)]


def test_contenders_taking_over_one_stale_lock_get_it_exactly_once(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    dirs = [tmp_path / f"run-{index}" for index in range(8)]
    for directory in dirs:
        directory.mkdir()
        (directory / rundir.LOCK).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    for outcomes in race("lock", "_stale", dirs):
        assert outcomes.count("locked") == 1, outcomes
        assert all("another fasync run" in outcome for outcome in outcomes if outcome != "locked"), outcomes


def test_new_runs_racing_on_one_absent_directory_lose_to_the_lock(tmp_path):
    dirs = [tmp_path / f"run-{index}" for index in range(4)]
    for directory, outcomes in zip(dirs, race("new", "_mark", dirs)):
        assert outcomes.count("locked") == 1, outcomes
        assert all("another fasync run" in outcome for outcome in outcomes if outcome != "locked"), outcomes
        assert rundir.is_run(directory)


def test_a_directory_a_run_died_setting_up_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    (out / rundir.LOCK).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    said = []
    lock = rundir.prepare_new(out, tmp_path, said.append)
    try:
        assert any("stale lock" in line for line in said) and rundir.is_run(out)
        assert json.loads((out / rundir.LOCK).read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_a_run_dir_name_too_long_for_the_filesystem_is_one_clear_line(tmp_path):
    out = tmp_path / ("a" * 300)
    result = fasync("train", str(write_config(tmp_path)), "--run-dir", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"cannot use {out}: the name is too long; choose another --run-dir" in result.stdout
    no_traceback(result)
