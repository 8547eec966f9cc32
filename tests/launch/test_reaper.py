"""The reaper (`fasync.launch.reaper`) kills what the driver started, however recently it started it."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

# A driver that starts its reaper, lets it settle, starts a process and ends its cluster at once: far less
# than the reaper's poll interval (`POLL_S`) between the two, as when a Ctrl-C cuts `ray.init` short just
# after it started Ray's processes.
DRIVER = textwrap.dedent("""
    import subprocess, sys, time
    from fasync.launch import reaper

    handle = reaper.start()
    time.sleep(1.2)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(child.pid, flush=True)
    reaper.finish(handle)
""")


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed process whose parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_a_process_the_driver_started_just_before_it_ended_is_killed():
    for _ in range(3):  # each time, the start falls at another point of the reaper's poll interval
        driver = subprocess.run([sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=60)
        assert driver.returncode == 0, driver.stderr
        child = int(driver.stdout.split()[0])
        deadline = time.monotonic() + 5
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        survived = running(child)
        if survived:
            os.kill(child, signal.SIGKILL)
        assert not survived, f"process {child}, started just before the driver ended, outlived its reaper"
