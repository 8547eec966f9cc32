"""The reaper: when `fasync train` ends, however it ends (SIGKILL included), the processes of the Ray
cluster it started end within a second or two.

Ray ties its GCS server and raylet to the driver (they get SIGKILL when it dies), but the raylet's agents
(`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) then try to report the raylet's death to the GCS that is
already gone and linger for 60 s or more. The reaper is a small process of its own session (Ctrl-C and a
process-group SIGTERM do not reach it) that notes the driver's descendants every `POLL_S` and, once the
pipe from the driver closes (the driver exited or was killed), kills those still running. Only Linux
(`/proc`); elsewhere `fasync train` runs without one.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

POLL_S = 0.5


def _processes() -> dict[int, tuple[int, int]]:
    """pid → (parent pid, start time in clock ticks) of every process this user can see."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (name) "
        table[int(entry)] = (int(fields[1]), int(fields[19]))
    return table


def descendants(root: int, table: dict[int, tuple[int, int]] | None = None) -> dict[int, int]:
    """pid → start time of every descendant of `root`."""
    table = _processes() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = table[child][1]
            todo.append(child)
    return found


def kill_alive(processes: dict[int, int]) -> list[int]:
    """SIGKILL those of `processes` (pid → start time) still running as the same process; their pids."""
    table = _processes()
    killed = []
    for pid, started in processes.items():
        if table.get(pid, (None, None))[1] == started:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
    return killed


def start() -> subprocess.Popen | None:
    """Start the reaper for this process; None where there is no /proc. The caller keeps the returned
    process (its stdin is the pipe whose end tells the reaper the driver is gone) and calls `finish`."""
    if not Path("/proc/self/stat").exists():
        return None
    return subprocess.Popen([sys.executable, "-m", "fasync.launch.reaper", str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def finish(reaper: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """The driver is done with its cluster: the reaper kills what is left of it, then exits."""
    if reaper is None:
        return
    reaper.stdin.close()
    try:
        reaper.wait(timeout_s)
    except subprocess.TimeoutExpired:
        reaper.kill()


def main(driver: int) -> None:
    me = os.getpid()
    # Processes the driver already had (a test runner's, say) are not the cluster's.
    before = descendants(driver)
    seen: dict[int, int] = {}
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], POLL_S)
        closed = bool(readable) and not os.read(sys.stdin.fileno(), 4096)  # the driver closed the pipe, or died
        # Looked at once more after the pipe closes: `finish` keeps the driver waiting for this process, so
        # what it started since the last look (Ray's processes, when a Ctrl-C cuts `ray.init` short) is still
        # its descendant.
        seen.update({pid: started for pid, started in descendants(driver).items()
                     if pid != me and before.get(pid) != started})
        if closed:
            break
    kill_alive(seen)


if __name__ == "__main__":
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    main(int(sys.argv[1]))
