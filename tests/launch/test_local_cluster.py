"""The local cluster `fasync train` starts (fasync/launch/local_cluster.py): its processes out of the driver's
process group, and without the two head processes a run never uses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from paths import REPO

pytestmark = pytest.mark.ray

STARTS_A_CLUSTER = """
import json, os, ray
from ray._private.node import Node
from fasync.launch.local_cluster import as_a_run_needs
from fasync.launch.reaper import descendants

before = (Node.start_api_server, Node.start_monitor)
with as_a_run_needs():
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="WARNING", log_to_driver=True)

@ray.remote
def greet():
    print("hello from a worker")
    return os.getpgid(0)

worker_group = ray.get(greet.remote())
commands = [open(f"/proc/{pid}/cmdline").read().replace("\\0", " ") for pid in descendants(os.getpid())]
print(json.dumps({"commands": commands, "worker_group": worker_group, "driver_group": os.getpgid(0),
                  "restored": (Node.start_api_server, Node.start_monitor) == before}), flush=True)
ray.shutdown()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_runs_cluster_leaves_out_the_dashboard_and_the_autoscaler_and_keeps_the_rest():
    result = subprocess.run([sys.executable, "-c", STARTS_A_CLUSTER], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))
    commands = " | ".join(found["commands"])
    assert "dashboard/dashboard.py" not in commands and "autoscaler/_private/monitor.py" not in commands, commands
    # What a run does use: the GCS, the raylet, the log monitor that brings the workers' output to the driver.
    for process in ("gcs_server", "raylet", "log_monitor.py"):
        assert process in commands, process
    assert "hello from a worker" in result.stdout + result.stderr
    assert found["worker_group"] != found["driver_group"]  # out of the driver's process group
    assert found["restored"]
