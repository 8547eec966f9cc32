"""Every run-directory command works on every kind of run directory fasync writes (issue 32 §3): `fasync
report`, `fasync ledger`, `fasync simulate --calibrate`, `fasync export` and `fasync train --resume` on runs
that finished (in each mode), were killed, were resumed once and twice, and failed. The run directories are
built once, by short real runs (the resumes among them), and shared by the tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import MODES, REPO, kill_after_a_checkpoint, start_train, write_config
from typer.testing import CliRunner

from fasync.cli import app
from fasync.metrics.writer import read_metrics, read_metrics_log

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

runner = CliRunner()

SHORT = {"train": {"num_rollouts": 3, "target_reward": None, "seed": 2}, "checkpoint": {"every": 1}}
FAILING_REWARD = '''
calls = 0


def score(completion: str, label: str) -> float:
    """Scores the first rollouts, then fails: a run that ends `failed` after a few steps."""
    global calls
    calls += 1
    if calls > 16 * 8 * 3:
        raise ValueError("the scorer's service went away")
    return float(completion == label)
'''


def finish(process: subprocess.Popen, expected: int) -> None:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == expected, output


def resume(source: Path, out: Path, rollouts: int) -> None:
    """Copy the run in `source` to `out` and resume it there for `rollouts` rollouts in all."""
    shutil.copytree(source, out)
    finish(start_train(None, out, "--resume", str(out), f"train.num_rollouts={rollouts}",
                 "--allow-config-change", "train.num_rollouts"), 0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """name -> run directory: finished in each mode, killed, resumed once and twice, failed."""
    base = tmp_path_factory.mktemp("runs")
    (base / "failmod.py").write_text(FAILING_REWARD)
    configs = {mode: write_config(base, name=f"{mode}.yaml", mode=mode, **MODES[mode], **SHORT) for mode in MODES}
    configs["long"] = write_config(base, name="long.yaml", **{**SHORT, "train": {**SHORT["train"],
                                                                                 "num_rollouts": 200}})
    configs["failing"] = write_config(base, name="failing.yaml", reward={"function": "failmod:score"},
                                      **{**SHORT, "train": {**SHORT["train"], "num_rollouts": 20}})
    out = {name: base / name for name in ("sync", "async", "fully_async", "killed", "failed")}
    # Independent runs start together: their Ray start-ups overlap.
    started = {name: start_train(configs[name], out[name]) for name in MODES}
    started["failed"] = start_train(configs["failing"], out["failed"])
    killed_at = kill_after_a_checkpoint(start_train(configs["long"], out["killed"]), out["killed"])
    for name, expected in (("sync", 0), ("async", 0), ("fully_async", 0), ("failed", 1)):
        finish(started[name], expected)
    out["resumed"], out["resumed twice"] = base / "resumed", base / "resumed-twice"
    resume(out["killed"], out["resumed"], killed_at + 3)
    resume(out["resumed"], out["resumed twice"], killed_at + 5)
    return out


KINDS = ["sync", "async", "fully_async", "killed", "resumed", "resumed twice", "failed"]


def test_the_run_directories_are_what_their_names_say(runs):
    def outcome(name: str) -> str | None:
        summary = runs[name] / "summary.json"
        return json.loads(summary.read_text())["outcome"] if summary.exists() else None

    assert [outcome(name) for name in KINDS] == ["finished"] * 3 + [None, "finished", "finished", "failed"]
    assert [len(read_metrics_log(runs[name] / "metrics.jsonl").resumes) for name in KINDS] == [0, 0, 0, 0, 1, 2, 0]
    assert read_metrics(runs["failed"] / "metrics.jsonl"), "the failed run wrote no step"


@pytest.mark.parametrize("kind", KINDS)
def test_report_charts_every_kind_of_run(runs, kind, tmp_path):
    result = runner.invoke(app, ["report", str(runs[kind]), "-o", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "report" / "report.md").read_text()
    resumes = len(read_metrics_log(runs[kind] / "metrics.jsonl").resumes)
    assert (f"resumed {resumes}×" in text) == (resumes > 0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_ledger_holds_on_every_kind_of_run(runs, kind):
    result = runner.invoke(app, ["ledger", str(runs[kind])])
    assert result.exit_code == 0, result.output
    resumes = len(read_metrics_log(runs[kind] / "metrics.jsonl").resumes)
    assert f"processes: {resumes + 1}" in result.output


@pytest.mark.parametrize("kind", KINDS)
def test_simulate_calibrates_from_every_kind_of_run(runs, kind):
    result = runner.invoke(app, ["simulate", str(runs[kind] / "config.yaml"), "--calibrate", str(runs[kind])])
    assert result.exit_code == 0, result.output
    assert f"calibrated from {runs[kind]}" in result.output


@pytest.mark.parametrize("kind", ["fully_async", "killed", "resumed twice", "failed"])
def test_export_writes_the_newest_checkpoint_of_every_kind_of_run(runs, kind, tmp_path):
    result = runner.invoke(app, ["export", str(runs[kind]), str(tmp_path / "model")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "model" / "model.safetensors").is_file()


@pytest.mark.parametrize("kind", ["fully_async", "resumed twice"])
def test_resume_of_a_finished_run_says_so_and_starts_nothing(runs, kind):
    result = subprocess.run([sys.executable, "-m", "fasync.cli", "train", "--resume", str(runs[kind])], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "already finished" in result.stdout and "nothing to resume" in result.stdout
