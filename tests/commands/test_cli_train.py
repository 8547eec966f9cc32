"""`fasync train`: what it refuses before Ray starts, the dry run, and what a run leaves behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from cli_runs import MODES, RUN_SECTIONS, fasync, write_config
from paths import REPO


def test_a_config_that_cannot_load_exits_1_before_anything_starts(tmp_path):
    config = write_config(tmp_path, train={"global_batch_sise": 128})
    result = fasync("train", str(config), "--run-dir", str(tmp_path / "out"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "global_batch_sise" in result.stdout and "did you mean" in result.stdout
    assert not (tmp_path / "out").exists()
    assert "Traceback" not in result.stdout + result.stderr


def test_lint_errors_stop_the_run_before_ray(tmp_path):
    config = write_config(tmp_path, rollout={"n_samples_per_prompt": 1}, train={"global_batch_size": 16})
    result = fasync("train", str(config), "--run-dir", str(tmp_path / "out"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "n_samples_per_prompt" in result.stdout
    assert "nothing was started" in result.stdout
    assert not (tmp_path / "out").exists()


def test_dry_run_prints_the_plan_and_trains_nothing(tmp_path):
    config = write_config(tmp_path, mode="fully_async")
    result = fasync("train", str(config), "--dry-run", "--run-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fully_async" in result.stdout
    assert "engine" in result.stdout.lower() and "trainer" in result.stdout.lower()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "sections, expected",
    [
        ({"data": {"path": "no/such/file.jsonl"}}, "no/such/file.jsonl"),
        ({"reward": {"function": "no_such_module_xyz:score"}}, "no_such_module_xyz"),
        ({"reward": {"function": "json:dumps_nothing"}}, "dumps_nothing"),
    ],
)
def test_bad_inputs_are_one_clear_message_before_training(tmp_path, sections, expected):
    config = write_config(tmp_path, **sections)
    result = fasync("train", str(config), "--run-dir", str(tmp_path / "out"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert expected in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_custom_reward_module_from_the_working_directory_reaches_the_actors(tmp_path):
    (tmp_path / "my_reward.py").write_text(textwrap.dedent("""
        def first_digit(completion, label):
            return float(completion[:1] == label[:1])
    """))
    config = write_config(tmp_path, reward={"function": "my_reward:first_digit"}, train={"num_rollouts": 2})
    result = fasync("train", str(config), "--run-dir", str(tmp_path / "out"), cwd=tmp_path,
                    env_extra={"PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["optimizer_steps"] == 2



@pytest.mark.ray
@pytest.mark.parametrize("mode", MODES)
def test_each_mode_learns_and_leaves_config_metrics_and_summary(ray_session, tmp_path, mode):
    from fasync.commands.train import run as train

    config = write_config(tmp_path, mode=mode, **MODES[mode])
    out = tmp_path / "out"
    assert train(str(config), ["train.seed=1"], run_dir=str(out)) == 0

    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["train"]["seed"] == 1 and resolved["mode"] == mode
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == RUN_SECTIONS["train"]["num_rollouts"]
    for key in ("step", "rollout", "weight_version", "reward_mean", "loss", "kl", "entropy", "clip_fraction",
                "grad_norm", "tokens_per_s", "wall_time", "generate_time_s", "train_time_s",
                "weight_sync_time_s", "staleness_mean", "staleness_max"):
        assert key in records[0], key
    bound = 0 if mode == "sync" else MODES[mode]["async"]["max_weight_staleness"]
    assert max(r["staleness_max"] for r in records) <= bound
    assert [r["wall_time"] for r in records] == sorted(r["wall_time"] for r in records)
    first = sum(r["reward_mean"] for r in records[:5]) / 5
    last = sum(r["reward_mean"] for r in records[-5:]) / 5
    assert last > first + 0.4, (first, last)

    summary = json.loads((out / "summary.json").read_text())
    ledger = summary["ledger"]
    assert ledger["produced"] == ledger["consumed"] + sum(ledger["dropped"].values()) + ledger["queued"] + \
        ledger["in_flight"]
    assert summary["outcome"] == "finished"


def test_a_rerun_into_the_same_directory_keeps_the_earlier_run(tmp_path):
    from fasync.launch import rundir

    out = tmp_path / "out"
    out.mkdir()
    (out / rundir.MARKER).write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    fresh = rundir.choose(None, "run.yaml", str(out))
    rundir.prepare_new(fresh, tmp_path, lambda line: None).release()
    assert fresh == out and [p.name for p in out.iterdir()] == [rundir.MARKER]
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("out-")]
    assert len(kept) == 1 and (kept[0] / "metrics.jsonl").read_text() == '{"step": 0}\n'


def test_ctrl_c_stops_the_run_cleanly_and_keeps_the_summary(tmp_path):
    import signal
    import time

    config = write_config(tmp_path, mode="fully_async", train={"num_rollouts": 100000})
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "fasync.cli", "train", str(config), "--run-dir", str(out)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 3):
        assert process.poll() is None and time.monotonic() < deadline, "the run did not start training"
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "interrupted" in output
    assert "Traceback" not in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outcome"] == "interrupted"
    assert summary["optimizer_steps"] >= 3
    # Ctrl-C stopped after the drain in progress, with a checkpoint of that very step: the run can be resumed.
    meta = json.loads((out / "checkpoints" / summary["last_checkpoint"] / "meta.json").read_text())
    assert meta["reason"] == "interrupted" and meta["step"] == summary["optimizer_steps"]
    assert not (out / ".fasync-lock").exists()
    # Issue 32 §4: the summary said nothing of how to go on, and Ray's token-auth note reached the console.
    assert output.rstrip().endswith(f"resume with: fasync train --resume {out}"), output
    assert "Token authentication" not in output


# -- issue 19 §3/§4: bad data before Ray, runs that learn nothing, rewards next to the config --------


def test_bad_data_is_one_message_before_ray_starts(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"prompt": "12=", "label": "21"}\n{"prompt": "\xff12=", "label": "21"}\n')
    config = write_config(tmp_path, data={"path": str(data), "task": None})
    result = fasync("train", str(config), "--run-dir", str(tmp_path / "out"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"data.path: {data}:2: not UTF-8 text (byte 0xff at column 13)" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr and not (tmp_path / "out").exists()


def test_a_learning_rate_the_model_cannot_take_is_refused(tmp_path):
    config = write_config(tmp_path, train={"lr": 10})
    result = fasync("train", str(config), "--run-dir", str(tmp_path / "out"))
    assert result.returncode == 1 and "A005" in result.stdout and "nothing was started" in result.stdout


@pytest.mark.ray
def test_a_run_whose_entropy_collapses_warns_in_metrics_and_summary(ray_session, tmp_path):
    from fasync.commands.train import run as train
    from fasync.metrics.signal import STREAK_STEPS

    # train.lr=10 passed the check and ran to exit 0 with entropy 0 from step 1; A005 now refuses it, so the
    # warning is tested with the rule silenced.
    config = write_config(tmp_path, train={"lr": 10, "num_rollouts": STREAK_STEPS + 3}, lint={"ignore": ["A005"]})
    out = tmp_path / "out"
    assert train(str(config), run_dir=str(out)) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r["entropy_collapse_streak"] for r in rows) >= STREAK_STEPS
    summary = json.loads((out / "summary.json").read_text())
    assert any("entropy stayed at or below" in w for w in summary["warnings"])
    assert any("every advantage was 0" in w for w in summary["warnings"])


def test_reward_modules_import_from_the_config_and_working_directories_on_the_workers(tmp_path):
    # The console script's import path holds neither directory: this failed with "is it on PYTHONPATH?".
    work, configs = tmp_path / "work", tmp_path / "configs"
    work.mkdir(), configs.mkdir()
    (work / "helpers_in_cwd.py").write_text("def first(text):\n    return text[:1]\n")
    (configs / "reward_next_to_config.py").write_text(textwrap.dedent("""
        from helpers_in_cwd import first

        def first_digit(completion, label):
            return float(first(completion) == first(label))
    """))
    config = write_config(configs, mode="fully_async", reward={"function": "reward_next_to_config:first_digit"},
                          train={"num_rollouts": 2})
    script = Path(sys.executable).with_name("fasync")

    def train(*args: str, cwd: Path = work) -> subprocess.CompletedProcess:
        return subprocess.run([str(script), "train", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})

    result = train(str(config), "--run-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["outcome"] == "finished"
    # Resumed without its config from elsewhere, the run works where it started (the helper module is found
    # there) and finds the reward beside the config it started from.
    result = train("--resume", str(tmp_path / "out"), "train.num_rollouts=3",
                   "--allow-config-change", "train.num_rollouts", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"working in {work.resolve()}, where the run started" in result.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["stop_reason"] == "completed all 3 rollouts"


def test_a_nan_reward_in_an_actor_is_one_message_naming_function_prompt_and_value(tmp_path):
    # fully_async scores in the rollouter actor; before, a NaN reached statistics.pstdev (AttributeError) or,
    # without std normalisation, trained a NaN step.
    (tmp_path / "nan_reward.py").write_text("def nan(completion, label):\n    return float('nan')\n")
    config = write_config(tmp_path, mode="fully_async", reward={"function": "nan_reward:nan"},
                          train={"num_rollouts": 2})
    result = fasync("train", str(config), "--run-dir", str(tmp_path / "out"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"fasync train: the run failed: reward.function: nan_reward:nan returned nan \(float\) for "
                     r"prompt \d+ \(task reverse \(length 2\)\)", result.stdout), result.stdout
    assert "Traceback" not in result.stdout + result.stderr and 'File "' not in result.stdout


def test_the_train_command_derives_the_config_once_for_the_lint_the_plan_and_the_run(tmp_path, monkeypatch):
    """Resolve once: the lint, the plan and everything the run builds take the one derivation."""
    import fasync.memory
    from fasync.commands.train import run as train

    calls = []
    derive = fasync.memory.derive
    monkeypatch.setattr(fasync.memory, "derive", lambda *args: calls.append(args) or derive(*args))
    assert train(str(write_config(tmp_path)), dry_run=True) == 0
    assert len(calls) == 1


def test_a_resume_refused_by_a_live_run_exits_1_as_documented_and_help_lists_every_exit_code(tmp_path):
    # Issue 32 §5.21: the refusal exited 2 (a usage error), where docs/training.md says 1; --help had no 143.
    from fasync.launch import rundir

    out = tmp_path / "out"
    out.mkdir()
    (out / rundir.MARKER).write_text("{}")
    lock = rundir.RunLock(out)
    lock.acquire()  # this test's process is the live run
    try:
        result = fasync("train", "--resume", str(out))
    finally:
        lock.release()
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"another fasync run (pid {os.getpid()}" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    help_text = " ".join(fasync("train", "--help", env_extra={"COLUMNS": "200"}).stdout.split())
    for code in ("0:", "1:", "2:", "130:", "143:"):
        assert f" {code}" in help_text, code


def test_no_module_beside_the_config_runs_in_the_runs_processes(tmp_path):
    # Issue 32 §5.7: a sitecustomize.py beside the config ran in 12 processes (the reaper, Ray's monitor, dashboard
    # and agents, every worker): the config's directory and the working directory went first on PYTHONPATH.
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import os
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran.txt"), "a") as ran:
            ran.write(f"{os.getpid()}\\n")
    """))
    (tmp_path / "reward_beside.py").write_text("def first_digit(completion, label):\n"
                                               "    return float(completion[:1] == label[:1])\n")
    config = write_config(tmp_path, mode="fully_async", reward={"function": "reward_beside:first_digit"},
                          train={"num_rollouts": 2})
    script = Path(sys.executable).with_name("fasync")  # not `python -m`, which puts its directory first itself
    result = subprocess.run([str(script), "train", str(config), "--run-dir", str(tmp_path / "out")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["outcome"] == "finished"
    assert not (tmp_path / "ran.txt").exists(), (tmp_path / "ran.txt").read_text()


def test_the_live_line_and_the_summary_count_optimizer_steps_alike_and_one_rollout_is_singular():
    # Issue 32 §4: the live line said `step 15` where the summary said "at optimizer step 16" (metrics.jsonl's
    # step counts from 0), and a one-rollout run "completed all 1 rollouts".
    from fasync.commands.train import completed
    from fasync.metrics.progress import format_line

    assert format_line({"step": 15}).startswith("step 16  ")
    assert format_line({}).startswith("step -  ")
    assert completed(1) == "completed its 1 rollout" and completed(3) == "completed all 3 rollouts"


def test_the_workers_draw_no_hugging_face_progress_bars_unless_asked(monkeypatch):
    # Issue 32 §4: the actors' weight loading drew Hugging Face's progress bars into the console.
    from fasync.commands.train import _worker_env

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    assert _worker_env()["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    assert _worker_env()["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"
