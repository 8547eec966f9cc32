"""The sandboxed `python` tool: whatever the model's code does (hang, crash, flood its output, fork, reach for the
network, eat memory) is one counted tool error, the run goes on, and nothing is left behind."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from fasync.rollout.sandbox import PythonSandbox
from fasync.rollout.tools import ToolCall, ToolError, run_tool_calls
from fasync.rollout.trajectory import TrajectoryStats


def run(code: str, **limits) -> str:
    return asyncio.run(PythonSandbox(**{"timeout_s": 5.0, **limits})(code))


def refused(code: str, **limits) -> ToolError:
    with pytest.raises(ToolError) as caught:
        run(code, **limits)
    return caught.value


def test_the_code_runs_and_its_output_comes_back_from_a_directory_removed_afterwards():
    output = run("import os\nprint(6 * 7)\nprint(os.getcwd())\nopen('scratch.txt', 'w').write('x')")
    answer, workdir = output.split()
    assert answer == "42"
    assert not os.path.exists(workdir)


def test_a_hang_is_killed_at_the_timeout():
    started = time.monotonic()
    error = refused("while True:\n    pass", timeout_s=1.0)
    assert error.kind == "timeout"
    # Well under the 5 s default: the process was killed at 1 s, not waited for.
    assert time.monotonic() - started < 4.0


@pytest.mark.parametrize("code, ending", [
    ("raise ValueError('bad input')", "exit status 1"),
    ("import os\nos.abort()", "killed by signal 6"),
])
def test_a_crash_is_an_error_whose_output_the_model_reads(code, ending):
    error = refused(code)
    assert error.kind == "crash" and str(error).startswith(ending)
    if "ValueError" in code:
        assert "ValueError: bad input" in str(error)


def test_a_flood_of_output_is_cut_off():
    error = refused("import sys\nsys.stdout.write('x' * 100_000_000)", max_output_bytes=16_384)
    assert error.kind == "output_limit"


def test_memory_past_the_cap_fails_the_code_not_the_run():
    error = refused("blob = bytearray(2 << 30)", memory_mb=256)
    assert error.kind == "crash" and "MemoryError" in str(error)


@pytest.mark.parametrize("code", [
    "import os\nif os.fork() == 0:\n    import time\n    time.sleep(60)",
    "import subprocess\nsubprocess.run(['sleep', '60'])",
    "import os\nos.system('sleep 60')",
])
def test_starting_a_process_is_refused(code):
    error = refused(code)
    assert error.kind == "forbidden" and "refused" in str(error)


@pytest.mark.parametrize("code", [
    "import socket\nsocket.create_connection(('93.184.216.34', 80), timeout=2)",
    "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)",
])
def test_the_network_is_refused(code):
    assert refused(code).kind == "forbidden"


def test_through_the_tool_loop_each_failure_is_one_counted_error():
    stats = TrajectoryStats()
    python = PythonSandbox(timeout_s=1.0, max_output_bytes=1_000)
    calls = [ToolCall("python", {"code": code}) for code in
             ("while True: pass", "import os; os.abort()", "print('x' * 10_000)", "import os; os.fork()",
              "import socket; socket.socket()", "print(1 + 1)")]
    messages = asyncio.run(run_tool_calls(calls, {"python": python}, 10.0, stats))
    assert stats.tool_errors == {"timeout": 1, "crash": 1, "output_limit": 1, "forbidden": 2}
    assert messages[-1]["content"] == "2\n"
