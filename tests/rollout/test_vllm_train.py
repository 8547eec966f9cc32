"""`fasync train` end to end with `rollout.engine: vllm` on vLLM's CPU build (`make test-vllm`), as a user runs
it: the CLI in a process of its own, with its own Ray cluster. Skipped where vllm is not installed."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from tiny_models import skip_unless_vllm_cpu, write_vllm_llama
from vllm_runs import finish, start_train, stop, write_run

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROLLOUTS = 6
RUNS = {
    "sync": {"mode": "sync"},
    "async": {"mode": "async", "async": {"max_weight_staleness": 1}, "correction": {"level": "token"}},
    "fully_async": {"mode": "fully_async", "async": {"max_weight_staleness": 2, "partial_rollout": True},
                    "correction": {"level": "token"}},
    # Weight syncs that keep the streamed requests and their KV cache in the engine.
    "fully_async_kept_kv": {"mode": "fully_async", "async": {"max_weight_staleness": 2, "partial_rollout": True,
                                                             "pause_mode": "keep"}, "correction": {"level": "token"}},
}
"""Each run's name and what its config sets beyond `write_run`'s."""

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    skip_unless_vllm_cpu()
    directory = tmp_path_factory.mktemp("tiny-llama-train")
    write_vllm_llama(directory)
    return directory


@pytest.fixture(scope="module")
def runs(model_dir, tmp_path_factory):
    """Every run of this module started at once, each with its own Ray cluster and vLLM engine: most of a run
    is starting up, and the runs overlap it. `kill` trains long enough to have its engine killed."""
    started = {}
    for name, run, rollouts in [*((run, run, ROLLOUTS) for run in RUNS), ("kill", "sync", 1000)]:
        directory = tmp_path_factory.mktemp(name)
        started[name] = (directory, start_train(directory, write_run(directory, model_dir, rollouts, **RUNS[run])))
    yield started
    for _, process in started.values():
        stop(process)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("run", RUNS)
def test_each_mode_learns_with_the_vllm_engine(runs, run):
    directory, process = runs[run]
    output = finish(process, directory, timeout=1100)
    assert process.returncode == 0, output[-4000:]
    records = [json.loads(line) for line in (directory / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == ROLLOUTS
    rewards = [r["reward_mean"] for r in records]
    assert sum(rewards[-2:]) / 2 > rewards[0] + 0.3, rewards
    assert all(r["ledger_balanced"] for r in records)
    summary = json.loads((directory / "out" / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["optimizer_steps"] == ROLLOUTS
    ledger = summary["ledger"]
    assert ledger["produced"] == ledger["consumed"] + sum(ledger["dropped"].values()) + ledger["queued"] + \
        ledger["in_flight"]
    if run == "sync":
        # The engine samples from the weights the trainer holds: behaviour and training policies agree up to
        # the two implementations' rounding (test_vllm_engine.TOLERANCE, 1e-4 per logprob), and k3 ≈ gap²/2.
        assert all(abs(r["is/kl_k3"]) < 1e-4 for r in records), [r["is/kl_k3"] for r in records]
        assert [r["weight_version"] for r in records] == list(range(ROLLOUTS))


def engine_pids(root: int) -> list[int]:
    """The engine actors' processes among `root`'s descendants (the run's own Ray cluster starts under it, and
    Ray names each worker process after its actor): never another run's."""
    children: dict[int, list[int]] = {}
    titles: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                titles[int(entry.name)] = (entry / "cmdline").read_bytes()
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            todo.append(child)
            if titles.get(child, b"").startswith(b"ray::EngineActor"):
                found.append(child)
    return found


@pytest.mark.timeout(1200)
def test_an_engine_killed_mid_run_fails_the_run_within_seconds(runs):
    directory, process = runs["kill"]
    metrics = directory / "out" / "metrics.jsonl"
    deadline = time.monotonic() + 1000
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 1):
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail("the run never reached its first step:\n" + finish(process, directory, timeout=0)[-4000:])
        time.sleep(0.5)
    pids = engine_pids(process.pid)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    killed = time.monotonic()
    # The failure is reported when the driver sees the engine's death; stopping the actors and the Ray
    # cluster after that takes seconds more on a busy machine.
    while "the run failed" not in (directory / "output.txt").read_text() and time.monotonic() - killed < 120:
        time.sleep(0.2)
    noticed = time.monotonic() - killed
    output = finish(process, directory, timeout=120)
    assert process.returncode != 0, output[-4000:]
    assert noticed < 20, noticed
    summary = json.loads((directory / "out" / "summary.json").read_text())
    assert summary["outcome"] == "failed" and summary["optimizer_steps"] < 1000
    assert "the run failed" in output
