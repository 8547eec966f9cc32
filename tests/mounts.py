"""A full disk and a read-only mount for tests, made in a user and mount namespace of the command's own
(`unshare -Urm`), so that no privilege is needed and nothing outside the command sees them: a small tmpfs,
filled up, or a read-only bind mount of a directory onto itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_FULL_DISK = 'mount -t tmpfs -o size=256k tmpfs "$0" && (head -c 1M /dev/zero > "$0/.fill") 2>/dev/null; exec "$@"'
_READ_ONLY = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'


def _in_a_namespace(script: str, mount_point: Path, command: tuple[str, ...], cwd: Path):
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-Urm", "true"], capture_output=True).returncode:
        pytest.skip("unshare -Urm is not allowed here, so nothing can be mounted")
    return subprocess.run(["unshare", "-Urm", "sh", "-c", script, str(mount_point), *command], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def python_on_a_full_disk(mount_point: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python ARGS` with `mount_point` (created here) a full disk."""
    mount_point.mkdir(parents=True, exist_ok=True)
    return _in_a_namespace(_FULL_DISK, mount_point, (sys.executable, *args), cwd)


def fasync_on_a_full_disk(mount_point: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m fasync.cli ARGS` with `mount_point` (created here) a full disk."""
    return python_on_a_full_disk(mount_point, "-m", "fasync.cli", *args, cwd=cwd)


def fasync_on_a_read_only_mount(directory: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m fasync.cli ARGS` with `directory` mounted read-only."""
    return _in_a_namespace(_READ_ONLY, directory, (sys.executable, "-m", "fasync.cli", *args), cwd)
