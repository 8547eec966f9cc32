"""How `fasync train` ends (issue 19 §2), each case as the user or the scheduler causes it, on a real
`fasync train` process with its own local Ray cluster: the exit code, the outcome and stop reason in
summary.json, and no process of the run left behind.

Each test reproduces a reported failure: SIGTERM recorded as `finished` with exit 15; two Ctrl-Cs exiting 1
and leaving Ray behind; Ctrl-C during Ray's start-up exiting without a message or summary; a killed actor
leaving a ledger labelled balanced; the raylet's agents outliving a SIGKILLed driver by 80–90 s; a running
`ray start` cluster making `fasync train` fail with a ValueError.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from paths import REPO
from sections import tiny_sections, with_sections

from fasync.launch.reaper import descendants

pytestmark = pytest.mark.ray

RUN_SECTIONS = {
    "mode": "fully_async",
    "data": {"length": 2},
    "rollout": {"batch_size": 8, "max_new_tokens": 2},
    "train": {"global_batch_size": 32, "micro_batch_size": 32, "num_rollouts": 100000, "lr": 1e-3},
}
"""What these runs change from the tiny run: fully_async, on two-digit reversal, one step a rollout, and
(almost) endless, so that every stop is the test's (lr 1e-3 is the schema's default)."""


def command(pid: int) -> str:
    """The process's name as its command line shows it (Ray's workers and agents rename themselves)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


class Train:
    """A `fasync train` process of the tiny config, its output collected as it runs."""

    def __init__(self, tmp_path: Path, env: dict | None = None, python: list[str] | None = None, **sections):
        """`python`: how to start Python's side of the command (`-m fasync.cli` by default)."""
        config = tmp_path / "run.yaml"
        config.write_text(yaml.safe_dump(with_sections(tiny_sections(**RUN_SECTIONS), **sections), sort_keys=False))
        self.out = tmp_path / "out"
        self.log = (tmp_path / "stdout.txt").open("w+")
        self.process = subprocess.Popen([sys.executable, *(python or ["-m", "fasync.cli"]), "train", str(config),
                                         "--run-dir", str(self.out)], cwd=REPO, stdout=self.log,
                                        stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})},
                                        start_new_session=True)
        self.seen: dict[int, int] = {}

    @property
    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()

    def wait_for(self, condition, what: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.process.poll() is None, f"fasync train ended before {what}:\n{self.output}"
            assert time.monotonic() < deadline, f"no {what} in {timeout_s} s:\n{self.output}"
            self.seen.update(descendants(self.process.pid))
            time.sleep(0.1)
        self.seen.update(descendants(self.process.pid))

    def training(self, steps: int = 3) -> None:
        metrics = self.out / "metrics.jsonl"
        self.wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= steps, f"{steps} steps")

    def actor_pid(self, name: str) -> int:
        for pid in descendants(self.process.pid):
            if command(pid).startswith(f"ray::{name}"):
                return pid
        raise AssertionError(f"no ray::{name} process")

    def finish(self, timeout_s: float = 90) -> tuple[int, str, dict | None]:
        deadline = time.monotonic() + timeout_s
        while (code := self.process.poll()) is None:  # noting the processes it starts on its way out
            if time.monotonic() > deadline:
                os.killpg(self.process.pid, signal.SIGKILL)
                raise AssertionError(f"fasync train still ran {timeout_s} s after the test stopped it:\n{self.output}")
            self.seen.update(descendants(self.process.pid))
            time.sleep(0.1)
        summary_path = self.out / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        return code, self.output, summary

    def left_running(self, within_s: float) -> list[str]:
        """The run's processes (every one seen while it ran) still alive `within_s` after it ended."""
        from fasync.launch.reaper import _processes

        deadline = time.monotonic() + within_s
        while True:
            table = _processes()
            alive = [pid for pid, started in self.seen.items() if table.get(pid, (0, None))[1] == started]
            if not alive or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return [name for pid in alive if (name := command(pid))]


@pytest.mark.parametrize("signals, group, code, outcome", [
    ([signal.SIGTERM], False, 143, "terminated"),
    ([signal.SIGTERM], True, 143, "terminated"),  # to the process group, as schedulers do: 134 before
    ([signal.SIGINT, signal.SIGINT], False, 130, "interrupted"),  # 0.3 s apart
])
def test_a_stop_signal_stops_cleanly_with_its_exit_code_and_leaves_nothing_running(tmp_path, signals, group, code,
                                                                                     outcome):
    run = Train(tmp_path)
    run.training()
    for index, signum in enumerate(signals):
        if index:
            time.sleep(0.3)
        if group:
            os.killpg(run.process.pid, signum)
        else:
            run.process.send_signal(signum)
    exit_code, output, summary = run.finish()
    assert exit_code == code, output
    assert "Traceback" not in output
    assert summary["outcome"] == outcome and summary["optimizer_steps"] >= 3
    name = signal.Signals(signals[0]).name
    assert summary["stop_reason"].startswith(f"{'terminated by SIGTERM' if code == 143 else 'interrupted by Ctrl-C'}")
    assert f"({name})" in summary["stop_reason"] or name == "SIGTERM"
    assert "at optimizer step" in summary["stop_reason"] and "completed all" not in output
    if len(signals) > 1:
        assert "again: skipping the rest of the clean stop" in output
    assert run.left_running(within_s=5) == []


HELD_REWARD = """
import os
import time

HOLD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hold")


def score(completion, label):
    while os.path.exists(HOLD):  # the test holds every reward (and so the rollout) while this file exists
        time.sleep(0.1)
    return float(completion == label)
"""

RECONNECT_WINDOW_S = 5
"""How long Ray's processes wait for a GCS that went away before they end themselves (60 s by default):
short here, so that a stop that outlasts it stays short."""


def test_a_group_sigterm_during_a_rollout_that_outlasts_rays_reconnect_window_still_stops_cleanly(tmp_path):
    """Issue 32 §5.1: the scheduler's SIGTERM to the process group also ended Ray's GCS and raylet; a clean stop
    longer than Ray's reconnect window then died with "Failed to connect to GCS within 60 seconds" (exit 1 after
    62 s, no summary, no checkpoint, a stale lock). Ray's processes now start in a session of their own."""
    from fasync import checkpoint
    from fasync.launch.rundir import LOCK

    (tmp_path / "held_reward.py").write_text(HELD_REWARD)
    run = Train(tmp_path, env={"RAY_gcs_rpc_server_reconnect_timeout_s": str(RECONNECT_WINDOW_S)},
                reward={"function": "held_reward:score"})
    run.training()
    hold = tmp_path / "hold"
    hold.touch()
    os.killpg(run.process.pid, signal.SIGTERM)
    time.sleep(RECONNECT_WINDOW_S + 5)  # the rollout in progress outlasts the window
    run.seen.update(descendants(run.process.pid))
    hold.unlink()
    exit_code, output, summary = run.finish(timeout_s=120)
    assert exit_code == 143, output
    assert "Traceback" not in output and "Failed to connect to GCS" not in output
    assert f"resume with: fasync train --resume {run.out}" in output
    assert summary["outcome"] == "terminated" and summary["optimizer_steps"] >= 3, summary
    assert "could not finish" not in summary["stop_reason"], summary["stop_reason"]
    last = checkpoint.latest(run.out)
    assert last is not None and last.record.reason == "terminated" and last.step == summary["optimizer_steps"]
    assert not (run.out / LOCK).exists()
    assert run.left_running(within_s=5) == []


def test_ctrl_c_while_ray_starts_prints_a_message_writes_a_summary_and_leaves_nothing(tmp_path):
    run = Train(tmp_path)
    run.wait_for(lambda: "starting a local Ray cluster" in run.output, "start-up message", timeout_s=60)
    time.sleep(0.5)  # ray.init takes seconds
    run.seen.update(descendants(run.process.pid))
    run.process.send_signal(signal.SIGINT)
    exit_code, output, summary = run.finish()
    assert exit_code == 130, output
    assert "Traceback" not in output
    assert "interrupted by Ctrl-C (SIGINT) while Ray was starting" in output
    assert summary["outcome"] == "interrupted" and summary["optimizer_steps"] == 0
    assert summary["stop_reason"] == "interrupted by Ctrl-C (SIGINT) while Ray was starting"
    assert run.left_running(within_s=5) == []


SIGNAL_WHERE_PYTHON_CANNOT_RAISE = """
import os, signal, sys
from fasync.commands import train
from fasync.cli import main

start_ray = train.start_ray


class SignalledWhileCollected:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # handled in here, where Python cannot raise: printed and ignored


def start_ray_with_ctrl_c_in_a_del(*args):
    start_ray(*args)
    SignalledWhileCollected()


train.start_ray = start_ray_with_ctrl_c_in_a_del
sys.argv[0] = "fasync"
sys.exit(main())
"""


def test_ctrl_c_that_comes_where_python_cannot_raise_during_start_up_still_stops_the_run(tmp_path):
    """CI (stop 39): the Ctrl-C came while ray.init's imports ran a weakref callback of importlib, its Stop was
    "ignored", and the run went on training. Here it comes in a `__del__` as ray.init returns."""
    run = Train(tmp_path, python=["-c", SIGNAL_WHERE_PYTHON_CANNOT_RAISE])
    exit_code, output, summary = run.finish()
    assert exit_code == 130, output
    assert "Traceback" not in output and "Exception ignored" not in output
    assert summary["outcome"] == "interrupted" and summary["optimizer_steps"] == 0
    assert summary["stop_reason"] == "interrupted by Ctrl-C (SIGINT) while Ray was starting"
    assert run.left_running(within_s=5) == []


def test_after_sigkill_of_the_driver_nothing_of_its_cluster_runs_for_more_than_a_few_seconds(tmp_path):
    run = Train(tmp_path)
    run.training()
    agents = [name for pid in descendants(run.process.pid) if (name := command(pid)).endswith("Agent")]
    assert agents, "the raylet's agents were expected among the run's processes"
    run.process.kill()
    run.process.wait(10)
    assert run.left_running(within_s=5) == []


@pytest.mark.parametrize("actor, named", [("TrainerActor", "trainer rank 0"), ("EngineActor", "engine 0")])
def test_a_killed_actor_fails_the_run_within_seconds_naming_it_and_the_ledger_is_honest(tmp_path, actor, named):
    from fasync import checkpoint
    from fasync.checkpoint.driver_file import load_driver_state
    from fasync.drivers import driver_state_types

    run = Train(tmp_path, checkpoint={"every": 2})
    run.training()
    run.wait_for(lambda: checkpoint.latest(run.out) is not None, "a checkpoint")
    os.kill(run.actor_pid(actor), signal.SIGKILL)
    killed = time.monotonic()
    exit_code, output, summary = run.finish()
    assert exit_code == 1, output
    assert time.monotonic() - killed < 30, "the run took too long to notice"
    assert summary["outcome"] == "failed" and named in summary["stop_reason"], summary["stop_reason"]
    assert "completed all" not in output
    ledger = summary["ledger"]
    counts = [ledger["consumed"], ledger["queued"], ledger["in_flight"], *ledger["dropped"].values()]
    balances = min(counts) >= 0 and ledger["produced"] == sum(counts)
    assert ledger["balanced"] == balances
    assert (": balanced" if balances else "UNBALANCED") in output
    # The run is resumable from its last good checkpoint, which the failure left as it was.
    last = checkpoint.latest(run.out)
    assert last is not None and last.step <= summary["optimizer_steps"] and load_driver_state(last, driver_state_types())["step"] == last.step
    assert run.left_running(within_s=5) == []


def test_a_running_ray_start_cluster_is_left_alone(tmp_path):
    """`ray start --head` in a directory of its own (so that no other test or session finds it), announced
    through RAY_ADDRESS: `fasync train` starts its own cluster, as the plan says, and never fails joining."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    temp_dir = tempfile.mkdtemp(prefix="fr", dir="/tmp")  # short: Ray's socket paths have a length limit
    ray_bin = Path(sys.executable).with_name("ray")
    head = subprocess.Popen([str(ray_bin), "start", "--head", "--block", f"--port={port}", "--num-cpus=1",
                             f"--temp-dir={temp_dir}", "--include-dashboard=false", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any("gcs_server" in command(pid) for pid in descendants(head.pid)):
            assert head.poll() is None and time.monotonic() < deadline, "ray start did not come up"
            time.sleep(0.5)
        run = Train(tmp_path, env={"RAY_ADDRESS": f"127.0.0.1:{port}"}, train={"num_rollouts": 2})
        exit_code, output, summary = run.finish(timeout_s=300)
        assert exit_code == 0, output
        assert "ValueError" not in output and "Traceback" not in output
        assert summary["outcome"] == "finished" and summary["stop_reason"] == "completed all 2 rollouts"
        assert "local Ray cluster started by fasync" in (tmp_path / "out" / "plan.txt").read_text()
    finally:
        cluster = descendants(head.pid)
        head.terminate()
        try:
            head.wait(30)
        finally:
            from fasync.launch.reaper import kill_alive

            kill_alive(cluster)
