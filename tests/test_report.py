"""`fasync report`: the charts are written as valid PNGs for one run and for five, the summary table states the
metrics' own numbers, and bad input is one clear message (file, line, what to do), never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from fasync.cli import app
from fasync.config.loader import load_config
from fasync.metrics.registry import check_row
from fasync.report import SUMMARY, ReportError, load_runs, summary_rows, write_report
from fasync.report.plots import CHARTS, idle_series, time_split

REPO = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()


def resolved_config(tmp_path: Path, mode: str, **sections) -> dict:
    """The resolved config `fasync train` writes into a run directory (`config.yaml`)."""
    source = tmp_path / f"source-{mode}.yaml"
    source.write_text(yaml.safe_dump({"mode": mode, **sections}))
    loaded = load_config(source)
    assert loaded.config is not None, [d.message for d in loaded.diagnostics]
    return loaded.raw


def step_rows(mode: str, rollouts: int = 6, steps_per_rollout: int = 2, staleness: int = 1,
              reward_start: float = 0.1) -> list[dict]:
    """Metrics rows as the drivers write them: every key registered for `mode`."""
    rows = []
    for rollout in range(rollouts):
        for index in range(steps_per_rollout):
            step = rollout * steps_per_rollout + index
            row = {
                "step": step, "rollout": rollout, "weight_version": rollout, "wall_time": 2.0 + rollout + 0.4 * index,
                "loss": 0.1, "num_samples": 16, "num_tokens": 64, "reward_mean": reward_start + 0.1 * rollout,
                "rollout_reward_mean": reward_start + 0.1 * rollout, "generate_time_s": 0.3 if index == 0 else 0.0,
                "train_time_s": 0.2, "train_call_time_s": 0.25, "weight_sync_time_s": 0.05 if index else 0.0,
                "staleness_mean": 0.5 * min(rollout, staleness), "staleness_max": min(rollout, staleness),
                "policy_lag_max": min(rollout, staleness) * steps_per_rollout + index,
                "is/kl_k3": 0.01 * (rollout + 1), "is/ess_token": 0.9, "is/chi2_token": 0.1,
                "is/truncated_token_frac": 0.02,
            }
            if mode != "sync":
                row["trainer_wait_s"] = 0.1
            if mode == "fully_async":
                row["queue_size"] = rollout % 3
            if index == steps_per_rollout - 1:  # an evaluation after every rollout, on its last row
                row.update({"eval/weight_version": rollout + 1, "eval/pass@k": min(1.0, 0.2 + 0.1 * rollout),
                            "eval/mean@k": 0.1 + 0.05 * rollout, "eval/reward_mean": 0.15 + 0.05 * rollout})
            check_row(row, mode)
            rows.append(row)
    return rows


def write_run(directory: Path, rows: list[dict], config: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if config is not None:
        (directory / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return directory


@pytest.fixture(scope="module")
def five_runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    modes = ["sync", "async", "fully_async", "fully_async", "async"]
    return [write_run(root / f"run-{i}-{mode}", step_rows(mode, rollouts=5 + i, staleness=0 if mode == "sync" else 2,
                                                          reward_start=0.05 * i),
                      resolved_config(root, mode, train={"target_reward": 0.5}))
            for i, mode in enumerate(modes)]


def assert_valid_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG, path
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        width, height = image.size
        assert width >= 600 and height >= 300
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 24)) > 10  # something was drawn, not a blank canvas


@pytest.mark.parametrize("count", [1, 5])
def test_every_chart_is_a_valid_png_embedded_in_report_md(five_runs, tmp_path, count):
    report = write_report(five_runs[:count], tmp_path / "out")
    assert report == tmp_path / "out" / "report.md"
    text = report.read_text()
    for name in CHARTS:
        assert_valid_png(tmp_path / "out" / f"{name}.png")
        assert f"![{name}]({name}.png)" in text
    for run in five_runs[:count]:
        assert f"**{run.name}**" in text


def test_the_table_states_the_metrics_numbers(tmp_path):
    rows = step_rows("async", rollouts=6, steps_per_rollout=2, staleness=1)
    run_dir = write_run(tmp_path / "run", rows, resolved_config(tmp_path, "async", train={"target_reward": 0.35}))
    (run,) = load_runs([run_dir])
    table = dict(zip(SUMMARY, summary_rows([run])[0]))
    assert table["mode"] == "async" and table["optimizer steps"] == 12 and table["rollouts"] == 6
    assert table["wall time (s)"] == rows[-1]["wall_time"] == 7.4
    assert table["final reward"] == pytest.approx(0.6) and table["best reward"] == pytest.approx(0.6)
    # Rollouts 2-4 (rewards 0.3, 0.4, 0.5) are the first three whose mean reaches 0.35: rollout 4 ends at 6.4 s.
    assert table["time to target (s)"] == pytest.approx(6.4)
    # The steady window runs from rollout 0's last row (2.4 s) to rollout 5's (7.4 s) and trains 5 × 32 samples.
    assert table["samples/s"] == pytest.approx(5 * 32 / 5.0)
    assert table["staleness max (versions)"] == 1 and table["policy lag max (optimizer steps)"] == 3
    assert table["staleness mean (versions)"] == pytest.approx(sum(r["staleness_mean"] for r in rows) / 12)
    # Per rollout: 2 × 0.25 s in train calls and 0.3 s generating, in 1 s of wall time.
    assert table["trainer idle (fraction)"] == pytest.approx(0.5)
    assert table["rollouter idle (fraction)"] == pytest.approx(0.7)
    assert table["is/ess_token mean (fraction)"] == pytest.approx(0.9)
    assert table["is/kl_k3 mean (nats/token)"] == pytest.approx(sum(r["is/kl_k3"] for r in rows) / 12)
    steps, trainer, rollouter = idle_series(run)
    assert steps == [3, 5, 7, 9, 11] and trainer == pytest.approx([0.5] * 5) and rollouter == pytest.approx([0.7] * 5)
    split = time_split(run)
    assert split["generate"] == pytest.approx(1000 * 6 * 0.3 / 12)
    assert split["trainer\nwaiting"] == pytest.approx(1000 * 6 * 0.1 / 12)  # a rollout-scope value, once per rollout
    text = write_report([run_dir], tmp_path / "out").read_text()
    assert "| run | async | 12 | 6 | 7.400 | 0.600 | 0.600 | 6.400 | 32.000 | 0.417 | 1 | 3 | 0.500 | 0.700 |" in text


def test_a_resumed_run_is_one_continuous_clock(tmp_path):
    first, second = step_rows("sync", rollouts=3), step_rows("sync", rollouts=3)
    for row in second:  # the resumed process reopens the file: its clock restarts
        row["step"] += 6
        row["rollout"] += 3
    (run,) = load_runs([write_run(tmp_path / "run", first + second)])
    times = [row["wall_time"] for row in run.rows]
    assert times == sorted(times) and run.resumes == 1
    assert times[6] == pytest.approx(first[-1]["wall_time"] + second[0]["wall_time"])


def test_the_resume_markers_fasync_writes_are_read_as_resumes(tmp_path):
    first, second = step_rows("sync", rollouts=3), step_rows("sync", rollouts=3)
    for row in second:  # a resumed run's clock runs on from its checkpoint
        row["step"] += 6
        row["rollout"] += 3
        row["wall_time"] += first[-1]["wall_time"]
    marker = {"resume": {"step": 6, "wall_time": first[-1]["wall_time"]}}
    (run,) = load_runs([write_run(tmp_path / "run", [*first, marker, *second])])
    assert [row["step"] for row in run.rows] == list(range(12)) and run.resumes == 1
    result = runner.invoke(app, ["report", str(tmp_path / "run"), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "resumed 1×" in (tmp_path / "out" / "report.md").read_text()


def test_runs_with_the_same_name_are_told_apart(tmp_path):
    a = write_run(tmp_path / "a" / "run", step_rows("sync"))
    b = write_run(tmp_path / "b" / "run", step_rows("sync"))
    assert [run.label for run in load_runs([a, b])] == ["a/run", "b/run"]
    assert [run.label for run in load_runs([a, b], ["base", "tuned"])] == ["base", "tuned"]


def test_a_run_without_config_or_with_a_foreign_one_still_reports(tmp_path):
    plain = write_run(tmp_path / "plain", step_rows("sync"))
    foreign = write_run(tmp_path / "foreign", step_rows("sync"), {"mode": "sync", "no_such_section": {"x": 1}})
    runs = load_runs([plain, foreign])
    assert runs[0].mode is None and runs[1].mode == "sync" and runs[1].max_lag is None
    assert_valid_png(write_report([plain, foreign], tmp_path / "out").parent / "staleness.png")


def bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = "".join(json.dumps(row) + "\n" for row in step_rows("sync"))
    cases = {
        "empty": ("", "metrics.jsonl: empty, the run wrote no optimizer step"),
        "truncated": (good + '{"step": 12, "rollout": 6, "wall_t', "metrics.jsonl:13: not a complete JSON object"),
        "damaged": (good.replace("\n", "\nnot json\n", 1), "metrics.jsonl:2: not a complete JSON object"),
        "foreign rows": ('{"loss": 1.0}\n', "metrics.jsonl:1: the row has no numeric step, rollout, wall_time"),
    }
    out = {}
    for name, (text, message) in cases.items():
        directory = tmp_path / name.replace(" ", "-")
        directory.mkdir()
        (directory / "metrics.jsonl").write_text(text)
        out[name] = (directory, message)
    not_a_run = tmp_path / "not-a-run"
    write_run(not_a_run / "inner", step_rows("sync"))
    out["not a run"] = (not_a_run, "not a run directory, it has no metrics.jsonl; pass the run directories "
                        f"themselves: {not_a_run / 'inner'}")
    out["missing"] = (tmp_path / "nowhere", "no such directory")
    return out


@pytest.mark.parametrize("case", ["empty", "truncated", "damaged", "foreign rows", "not a run", "missing"])
def test_bad_input_is_one_clear_message(tmp_path, case):
    directory, message = bad_inputs(tmp_path)[case]
    with pytest.raises(ReportError) as raised:
        load_runs([directory])
    assert message in str(raised.value) and str(directory) in str(raised.value)
    result = runner.invoke(app, ["report", str(directory), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out" / "report.md").exists()


def test_the_last_line_cut_off_says_how_to_recover(tmp_path):
    directory, _ = bad_inputs(tmp_path)["truncated"]
    with pytest.raises(ReportError, match="the run stopped while writing this line; remove it"):
        load_runs([directory])


def test_the_command_writes_next_to_a_single_run(five_runs):
    result = subprocess.run([sys.executable, "-m", "fasync.cli", "report", str(five_runs[0])], capture_output=True,
                            text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert (five_runs[0] / "report" / "report.md").is_file()
    assert_valid_png(five_runs[0] / "report" / "reward.png")
