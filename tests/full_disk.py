"""A full disk for tests: a small tmpfs, filled up, mounted in a user and mount namespace of the command's own
(`unshare`), so that no privilege is needed and nothing outside the command sees it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_MOUNT_AND_FILL = 'mount -t tmpfs -o size=256k tmpfs "$0" && (head -c 1M /dev/zero > "$0/.fill") 2>/dev/null; exec "$@"'


def full_disk_available() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-Urm", "true"], capture_output=True).returncode == 0


def fasync_on_a_full_disk(mount_point: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m fasync.cli ARGS` with `mount_point` (created here) a full disk; skips where namespaces are
    not allowed."""
    if not full_disk_available():
        pytest.skip("unshare -Urm is not allowed here, so no tmpfs can be mounted")
    mount_point.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["unshare", "-Urm", "sh", "-c", _MOUNT_AND_FILL, str(mount_point), sys.executable, "-m",
                           "fasync.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd)
