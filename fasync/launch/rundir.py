"""The run directory: what marks it as a fasync run, the lock that keeps a second run out, and where an
earlier run goes when a new one starts in its place.

- `MARKER` (`.fasync-run`) is written first into every run directory. Only a directory holding it is ever
  moved aside for a new run or resumed; any other non-empty directory (a project, a home) is refused. It
  records the working directory the run started in and its config's directory, so that `--resume` without a
  config resolves relative paths and finds a `module:function` reward as the run did.
- `LOCK` (`.fasync-lock`) holds the pid and host of the run using the directory, and the run holds it
  locked (`flock`) while it lasts, so that of two runs started together, or taking over one stale lock
  together, exactly one gets it. A lock whose process is gone (same host, pid not running) is stale and
  taken over, with a note. The lock is removed when the run ends; a run killed with SIGKILL leaves the file
  (the kernel drops its `flock`), and the next run or resume finds it stale.

Torch-free: `fasync train` uses it before Ray starts.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path

from fasync.atomic import RunFileError, describe_os_error, write_json_atomic

MARKER = ".fasync-run"
LOCK = ".fasync-lock"


def choose(configured: str | None, config_path: str, run_dir: str | None) -> Path:
    """`--run-dir`, else `logging.run_dir`, else runs/<config name>-<time>; absolute (trainer rank 0 writes
    checkpoints there, wherever it runs) and resolved, so that `.` is the directory's real name."""
    chosen = run_dir or configured
    if chosen is None:
        chosen = f"runs/{Path(config_path).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(chosen).expanduser().resolve()


def is_run(path: Path) -> bool:
    return (path / MARKER).is_file()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


class RunDirectoryBusy(RunFileError):
    """Another live run holds the directory's lock: a refusal of the run (exit 1), not of its arguments."""


class RunLock:
    """The lock on one run directory, held as an exclusive `flock` on its lock file for as long as the run
    lasts; `release` removes the file (only if it is still the one this process locked)."""

    def __init__(self, directory: Path):
        self.path = directory / LOCK
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self) -> str | None:
        """Take the lock; returns a note when a stale lock was taken over. Raises RunFileError when a live
        run holds it."""
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                hint = "; copy the run directory somewhere writable and use the copy" if error.errno == errno.EROFS else ""
                raise RunFileError(f"cannot lock the run directory: {describe_os_error(self.path, error)}{hint}") \
                    from error
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise self._refusal(self._holder()) from None
            except OSError as error:
                os.close(fd)
                raise RunFileError(f"cannot lock the run directory: {describe_os_error(self.path, error)}") from error
            if self._still_at_path(fd):
                break
            os.close(fd)  # the run holding it ended and removed the file while this one waited: lock anew
        # Only one process at a time gets here for this directory, so that looking at the holder the file
        # names and writing this process in its place is one step: of two runs taking over a stale lock
        # together, one gets it and the other is refused.
        holder = self._holder()
        if holder is not None and not self._stale(holder):
            os.close(fd)  # a live run whose release does not hold the file locked (an earlier fasync)
            raise self._refusal(holder)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(me).encode())
        self._fd = fd
        if holder is None:
            return None
        return (f"fasync train: took over the stale lock of pid {holder['pid']} on {holder['host']}, which is no "
                "longer running")

    def _still_at_path(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except OSError:
            return False

    def _refusal(self, holder: dict | None) -> "RunDirectoryBusy":
        who = f"pid {holder['pid']} on {holder['host']}" if holder else "another process"
        return RunDirectoryBusy(f"{self.path.parent}: another fasync run ({who}) is using this run directory; wait for "
                            f"it to end or choose another --run-dir (if that run is gone, delete {self.path})")

    def _holder(self) -> dict | None:
        try:
            holder = json.loads(self.path.read_text())
            return holder if isinstance(holder, dict) and isinstance(holder.get("pid"), int) and "host" in holder else None
        except (OSError, ValueError):
            return None

    @staticmethod
    def _stale(holder: dict) -> bool:
        # A lock from another host cannot be checked from here: it stands until removed by hand.
        return holder["host"] == socket.gethostname() and not _pid_alive(int(holder["pid"]))

    def release(self) -> None:
        if self.held:
            if self._still_at_path(self._fd):
                self.path.unlink(missing_ok=True)  # while still locked: a waiting run then locks a new file
            os.close(self._fd)
            self._fd = -1


def _finished(path: Path) -> bool:
    try:
        return json.loads((path / "summary.json").read_text()).get("outcome") == "finished"
    except (OSError, ValueError, AttributeError):
        return False


def _check_usable(path: Path) -> None:
    """A clear error for a path that cannot be a run directory: a file, a name too long, a parent not
    searchable."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return
    except OSError as error:
        raise RunFileError(f"cannot use {describe_os_error(path, error)}; choose another --run-dir") from error
    if not stat.S_ISDIR(found.st_mode):
        raise RunFileError(f"{path}: is a file, not a directory; choose another --run-dir")


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RunFileError(f"cannot create the run directory {describe_os_error(path, error)}") from error


def _mark(path: Path, config_dir: Path) -> None:
    write_json_atomic(path / MARKER, {"fasync_run": 1, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                      "cwd": str(Path.cwd()), "config_dir": str(config_dir.resolve())})


def recorded_dir(path: Path, key: str) -> Path | None:
    """A directory the marker of the run in `path` records ("cwd": the working directory the run started in;
    "config_dir": its config's directory), where it records one (runs of earlier releases do not) and it
    still exists."""
    try:
        recorded = json.loads((path / MARKER).read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return Path(recorded) if isinstance(recorded, str) and Path(recorded).is_dir() else None


def prepare_new(path: Path, config_dir: Path, echo=print) -> RunLock:
    """Make `path` a fresh, locked run directory for a run of the config in `config_dir`. An earlier fasync
    run there is moved aside (under its lock, so that a run still using it is refused); any other non-empty
    directory is refused."""
    _check_usable(path)
    if path.is_dir() and any(path.iterdir()):
        if not is_run(path) and not (path / LOCK).exists():
            raise _not_a_run(path)
        # Locked first: a run that is using the directory, or setting it up (locked, not marked yet), refuses.
        old_lock = _locked(path, echo)
        if not is_run(path):
            if [child.name for child in path.iterdir()] != [LOCK]:
                old_lock.release()
                raise _not_a_run(path)
            _mark(path, config_dir)  # a run that died setting the directory up left only its lock
            return old_lock
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime((path / MARKER).stat().st_mtime))
        kept = path.with_name(f"{path.name}-{stamp}")
        while kept.exists():
            kept = kept.with_name(kept.name + "_")
        try:
            path.rename(kept)
        except OSError as error:
            old_lock.release()
            raise RunFileError(f"cannot move the previous run aside: {describe_os_error(path, error)}") from error
        old_lock.release()
        (kept / LOCK).unlink(missing_ok=True)
        hint = "" if _finished(kept) else f" (it had not finished: `fasync train --resume {kept}` continues it)"
        echo(f"fasync train: the previous run in {path} was moved to {kept}{hint}")
    _mkdir(path)
    lock = _locked(path, echo)
    try:
        _mark(path, config_dir)
    except RunFileError:
        lock.release()
        raise
    return lock


def _not_a_run(path: Path) -> RunFileError:
    return RunFileError(f"{path}: is not empty and holds no fasync run (no {MARKER}); fasync only replaces its "
                        "own run directories. Choose an empty or new --run-dir")


def open_for_resume(path: Path, echo=print) -> RunLock:
    """Lock an existing run directory to resume it; a path that is not one is a clear error."""
    _check_usable(path)
    if not path.exists():
        raise RunFileError(f"--resume {path}: no such directory")
    if not is_run(path):
        raise RunFileError(f"--resume {path}: not a fasync run directory (no {MARKER}); give the directory "
                           "a `fasync train` run wrote")
    return _locked(path, echo)


def _locked(path: Path, echo) -> RunLock:
    """`path`'s lock, taken; what taking it had to say (a stale lock taken over) is echoed."""
    lock = RunLock(path)
    note = lock.acquire()
    if note:
        echo(note)
    return lock
