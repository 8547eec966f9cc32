"""The kill-point matrix (issue 32, scripts/kill_matrix.py): `make test-kill` runs every case; here, a rotating
sample of one case per mode (a case is a run, a kill and one or more resumes: 13 to 106 s on a quiet two-core
machine, docs/training.md), so that CI keeps within its time. A seed from FASYNC_KILL_SEED, or else the day,
chooses them, and is printed, so that a red build names the cases to run again. The kill points themselves
(fasync/killpoints.py) are checked without a run."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import signal
import subprocess
import sys

import pytest
from paths import REPO

PER_MODE = 1


def matrix():
    spec = importlib.util.spec_from_file_location("kill_matrix", REPO / "scripts" / "kill_matrix.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def rotation_seed() -> int:
    return int(os.environ.get("FASYNC_KILL_SEED") or datetime.date.today().toordinal())


def test_every_mode_has_at_least_20_kill_cases_at_points_the_code_defines():
    from fasync.killpoints import POINTS

    km = matrix()
    for mode in km.MODE_SECTIONS:
        found = km.cases((mode,))
        assert len(found) >= 20, mode
        assert {kill.split(":")[0] for case in found for kill in case.kills} <= set(POINTS)
    assert len(km.sample(("sync",), 2, 3)) == 2
    assert km.sample(("sync",), 2, 3) == km.sample(("sync",), 2, 3)
    assert km.sample(("async",), 2, 3) == km.sample(tuple(km.MODE_SECTIONS), 2, 3)[2:4]  # alike alone or among all


def test_every_kill_point_is_reached_in_the_code():
    """Each named point has its hook: a point no code passes would make its cases silently "not reached"."""
    from fasync.killpoints import POINTS

    source = "\n".join(path.read_text() for path in (REPO / "fasync").rglob("*.py"))
    assert all(f'kill_point("{point}")' in source for point in POINTS)


def test_a_kill_point_kills_its_process_group_on_the_nth_pass(tmp_path):
    script = ("from fasync.killpoints import kill_point\n"
              "for n in range(1, 5):\n    print(n, flush=True)\n    kill_point('rollout_end')\n"
              "    kill_point('journal_append')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "FASYNC_KILL_AT": "rollout_end:3"}
    env.pop("FASYNC_KILL_GROUP", None)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            start_new_session=True, timeout=60)
    assert result.returncode == -signal.SIGKILL and result.stdout.split() == ["1", "2", "3"]
    env.pop("FASYNC_KILL_AT")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.split() == ["1", "2", "3", "4"]


def test_a_kill_point_in_another_group_kills_the_drivers_group():
    """Ray starts the actors in process groups of their own: a kill point there must take the driver's group."""
    child = "from fasync.killpoints import kill_point\nkill_point('engine_generate')\n"
    driver = ("import subprocess, sys, time\nimport fasync.killpoints\n"
              f"subprocess.run([sys.executable, '-c', {child!r}], start_new_session=True)\n"
              "time.sleep(30)\nprint('survived', flush=True)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "FASYNC_KILL_AT": "engine_generate:1"}
    env.pop("FASYNC_KILL_GROUP", None)
    result = subprocess.run([sys.executable, "-c", driver], env=env, capture_output=True, text=True,
                            start_new_session=True, timeout=60)
    assert result.returncode == -signal.SIGKILL and "survived" not in result.stdout


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("mode", ["sync", "async", "fully_async"])
def test_a_rotating_sample_of_kills_resumes_with_an_exact_ledger(tmp_path, mode):
    km = matrix()
    seed = rotation_seed()
    print(f"kill matrix sample: seed {seed} (FASYNC_KILL_SEED={seed}, or `python scripts/kill_matrix.py --mode {mode} "
          f"--sample {PER_MODE} --seed {seed}`, repeats it)")
    failed = []
    for case in km.sample((mode,), PER_MODE, seed):
        result = km.run_case(case, tmp_path)
        print(f"  {case.name}: {result.verdict.splitlines()[0]} ({result.seconds:.0f} s)")
        if not result.held:
            failed.append(f"{case.name}: {result.verdict}")
    assert not failed, f"seed {seed}:\n" + "\n".join(failed)


AGENTIC_ROLLOUTS = 8
SLOW_ENVIRONMENT = """
import asyncio

from fasync.rollout.env_loop import Step


class SlowCount:
    \"\"\"Three turns whatever the model says, each answered after 0.3 to 1.2 s by the prompt's digit: trajectories
    spend most of their time between turns, generation (not training) sets the run's pace, and groups end at
    different times, so that a checkpoint finds trajectories part-way through their turns.\"\"\"

    async def reset(self, task):
        self.turns, self.delay_s = 0, 0.3 * (1 + int(task.label) % 4)
        return [{"role": "user", "content": "count"}]

    async def step(self, model_text):
        await asyncio.sleep(self.delay_s)
        self.turns += 1
        return Step([{"role": "user", "content": str(self.turns)}], float(model_text.strip()[:1] == str(self.turns)),
                    done=self.turns == 3)
"""
AGENTIC = {
    "mode": "fully_async",
    "model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 48},
    "data": {"task": "reverse", "length": 1},
    "rollout": {"env": "slow_count:SlowCount", "max_turns": 3, "max_new_tokens": 2, "max_observation_tokens": 8,
                "batch_size": 4, "n_samples_per_prompt": 4},
    "train": {"global_batch_size": 16, "micro_batch_size": 16, "num_rollouts": AGENTIC_ROLLOUTS, "lr": 3e-3,
              "target_reward": None},
    "async": {"max_weight_staleness": 2, "partial_rollout": True},
    "correction": {"level": "token"},
    "checkpoint": {"every": 1, "keep": AGENTIC_ROLLOUTS},
    "logging": {"progress": "none"},
}
"""Three model turns a trajectory, one drain's trajectories generating at once, a checkpoint after every drain,
all kept."""
AGENTIC_KILL = "agent_step:250"
"""The rollouter's 250th step of a trajectory (after a model turn, before its environment answers): 48 a drain,
so in the sixth drain's generation. Admission keeps the rollouter at most `max_weight_staleness` + 1 drains ahead
of the trainer, whose checkpoints after the first drains are then written."""


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(1200)
def test_a_kill_mid_trajectory_resumes_the_trajectories_in_flight_with_an_exact_ledger(tmp_path):
    """SIGKILL while the rollouter's trajectories are between their turns; the checkpoint the resume starts from
    holds trajectories in flight with their turns so far, the resumed run finishes and `fasync ledger` passes.

    Which checkpoints hold such a trajectory depends on timing: under load, a checkpoint can find the next drain's
    trajectories just admitted, in their first model turn, which the snapshot aborts (turn 0). So every
    checkpoint is kept, and the newer ones than the newest holding a part-way trajectory are set aside, as the
    docs tell a user to do to resume from an earlier checkpoint."""
    import shutil

    import yaml

    from fasync import checkpoint
    from fasync.checkpoint.driver_file import load_driver_state
    from fasync.drivers import driver_state_types

    def part_way(path) -> bool:
        rollouter = load_driver_state(checkpoint.validate(path), driver_state_types())["mode"]["rollouter"]
        return any(point.stats.turns >= 1 and any(point.request.loss_mask)
                   for group in rollouter["in_flight"] for point in group.in_progress.values())

    km = matrix()
    (tmp_path / "slow_count.py").write_text(SLOW_ENVIRONMENT)
    config = tmp_path / "agentic.yaml"
    config.write_text(yaml.safe_dump(AGENTIC, sort_keys=False))
    run_dir = tmp_path / "run"
    killed = km._fasync(["train", str(config), "--run-dir", str(run_dir)], AGENTIC_KILL)
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:]
    taken = checkpoint.candidates(run_dir)
    holding = [index for index, path in enumerate(taken) if part_way(path)]
    assert holding, f"none of the {len(taken)} checkpoints kept a trajectory part-way through its turns"
    for newer in taken[holding[-1] + 1:]:
        shutil.rmtree(newer)
    resumed = km._fasync(["train", "--resume", str(run_dir)])
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["optimizer_steps"] == AGENTIC_ROLLOUTS
    assert km._ledger(run_dir, "held", ended=True) == "held"
