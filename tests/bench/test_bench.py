"""`fasync bench`: every mode runs from one base config, and the report has every field with sane values.

Timing goals are not asserted: on a shared two-core machine they are a measurement, not a property.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from paths import REPO
from sections import tiny_sections

from fasync.bench.modes import LongTail, mode_overrides, variant_overrides
from fasync.bench.report import write_block
from fasync.metrics.measure import ideal_speedup, measure, median_report, time_to_target

EXAMPLES = REPO / "configs"
BASE = tiny_sections(data={"length": 2}, rollout={"max_new_tokens": 2},
                     train={"global_batch_size": 16, "micro_batch_size": 16, "target_reward": 0.9},
                     logging={"progress": "auto"})
"""The bench's base config: the tiny run on two-digit reversal, one step a rollout, stopping at a reward of
0.9, with the live display as the schema's default leaves it."""
BOUNDS = {"sync": 0, "async": 1, "fully_async": 2}


def test_mode_settings_come_from_the_example_configs():
    shipped = yaml.safe_load((EXAMPLES / "fully_async.yaml").read_text())
    overrides = mode_overrides("fully_async", EXAMPLES)
    assert overrides[0] == "mode=fully_async"
    assert f"async.max_weight_staleness={shipped['async']['max_weight_staleness']}" in overrides
    assert f'correction.ratio_anchor="{shipped["correction"]["ratio_anchor"]}"' in overrides
    assert mode_overrides("sync", EXAMPLES) == ["mode=sync"]


def test_a_variant_overrides_each_key_once_with_its_last_setting():
    tail = LongTail(slices=(12,)).scenario(Path("long-tail.jsonl"))
    for variant in tail.variants:
        overrides = variant_overrides(tail, variant, EXAMPLES)
        keys = [item.split("=", 1)[0] for item in overrides]
        assert len(keys) == len(set(keys)), overrides
    no_partial = variant_overrides(tail, tail.variants[-1], EXAMPLES)
    assert "async.partial_rollout=false" in no_partial and "async.partial_rollout=true" not in no_partial


def test_time_to_target_uses_the_running_mean_of_three_rollouts():
    rewards = [1.0, 0.2, 0.95, 0.95, 0.6, 1.0, 1.0, 1.0]
    records = [{"rollout": i, "rollout_reward_mean": r, "wall_time": 10.0 + i} for i, r in enumerate(rewards)]
    assert time_to_target(records, 0.9) == 17.0  # rollouts 5-7 are the first three whose mean reaches 0.9
    assert time_to_target(records, 1.01) is None


def test_phases_and_idle_fractions_come_from_the_steady_window():
    records = [{"rollout": i, "wall_time": 5.0 + i, "num_samples": 100, "staleness_mean": 1.0, "staleness_max": 1,
                "rollout_reward_mean": 0.5, "generate_time_s": 0.25, "train_time_s": 0.5,
                "train_call_time_s": 0.75, "weight_sync_time_s": 0.0} for i in range(5)]
    report = measure("async", 0, records, 0.9, engines=1)
    assert report.window_s == 4.0 and report.samples_per_s == 100.0  # the first rollout is start-up
    assert report.trainer_idle == 0.25 and report.rollouter_idle == 0.75
    assert ideal_speedup(report) == 1.5
    assert report.time_to_target_s is None and report.runs_reached == 0
    assert report.stale_dropped == 0.0


def test_samples_dropped_as_stale_count_against_all_generated_for_training():
    records = [{"rollout": i, "wall_time": 1.0 + i, "num_samples": 100, "staleness_mean": 2.0, "staleness_max": 2,
                "rollout_reward_mean": 0.5, "dropped_stale": 25 if i else 0} for i in range(5)]  # per drain
    assert measure("fully_async", 0, records, 0.9, engines=1).stale_dropped == 100 / 600


def test_repeated_runs_merge_into_medians_and_counts():
    def run(samples: int, reward: float, staleness: int):
        records = [{"rollout": i, "wall_time": 2.0 + i, "num_samples": samples, "staleness_mean": staleness,
                    "staleness_max": staleness, "rollout_reward_mean": reward, "generate_time_s": 0.1,
                    "train_time_s": 0.2, "train_call_time_s": 0.3, "weight_sync_time_s": 0.0} for i in range(4)]
        return measure("fully_async", 0, records, 0.9, engines=1)

    merged = median_report([run(100, 1.0, 1), run(300, 0.5, 2), run(200, 1.0, 2)])
    assert merged.samples_per_s == 200.0 and sorted(merged.runs_samples_per_s) == [100.0, 200.0, 300.0]
    assert merged.runs_reached == 2 and merged.time_to_target_s == 4.0  # the two runs that reached 0.9
    assert merged.staleness_max == 2 and merged.rollouts == 4


def test_generated_blocks_replace_only_themselves(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nHand-written findings.\n\n<!-- bench-modes:begin -->\nold\n"
                   "<!-- bench-modes:end -->\n\nMore prose.\n")
    write_block(doc, "modes", "| new table |")
    write_block(doc, "long-tail", "tail text")
    text = doc.read_text()
    assert "Hand-written findings." in text and "More prose." in text
    assert "old" not in text and "| new table |" in text
    assert text.index("| new table |") < text.index("More prose.") < text.index("tail text")


def test_the_curves_pass_over_a_run_that_wrote_nothing(tmp_path):
    """A run that failed before its first step must not cost the benchmark its other curves."""
    from run_rows import step_rows, write_run

    from fasync.bench.modes import ScenarioResult, standard_scenario
    from fasync.bench.report import curves

    failed = [tmp_path / "failed-a", tmp_path / "failed-b"]
    for directory in failed:
        directory.mkdir()
        (directory / "metrics.jsonl").write_text("")
    dirs = {"sync": [write_run(tmp_path / "sync", step_rows("sync"))],
            "async": [failed[0], write_run(tmp_path / "async", step_rows("async"))],
            "fully_async": [failed[1]]}
    text = curves(ScenarioResult(standard_scenario(), 0.9, [], dirs), tmp_path / "charts", tmp_path)
    assert "No curves for fully_async: no run of it wrote a metrics row." in text
    assert "![reward](charts/reward.png)" in text and (tmp_path / "charts" / "reward.png").is_file()
    report = (tmp_path / "charts" / "report.md").read_text()
    assert "**sync**" in report and "**async**" in report and "**fully_async**" not in report


def test_the_script_is_the_cli_command():
    result = subprocess.run([sys.executable, "bench/modes.py", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--no-long-tail" in result.stdout


def test_a_base_config_without_the_mode_configs_beside_it_is_one_clear_error(tmp_path):
    """The bench reads nothing by a path relative to the installed package: the modes' settings come from
    the configs beside the base config, and their absence is a usage error that names the directory."""
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(BASE))
    result = subprocess.run([sys.executable, "-m", "fasync.cli", "bench", str(config), "--no-write"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"{tmp_path} has no async.yaml or fully_async.yaml" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.ray
@pytest.mark.timeout(900)  # seven tiny runs and their charts: past the default 300 s on a loaded two-core machine
def test_every_mode_and_the_long_tail_report_every_field(ray_session, tmp_path):
    from fasync.bench.report import benchmark
    from fasync.commands.train import run as train

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(BASE))
    doc = tmp_path / "benchmarks.md"
    tail = LongTail(short=1, long=3, long_fraction=0.25, pool=64, rollouts=4, target=0.5, micro_batch_size=8,
                    slices=(2,))
    results, blocks = benchmark(train, str(config), [], out_dir=tmp_path / "runs", doc=doc, long_tail=tail,
                                command="fasync bench tiny.yaml", examples=EXAMPLES)

    standard, long_tail = results
    assert [r.mode for r in standard.reports] == ["sync", "async", "fully_async"]
    assert [r.mode for r in long_tail.reports] == ["async", "fully_async", "fully_async", "fully_async"]
    for report in standard.reports + long_tail.reports:
        assert report.exit_code == 0
        assert report.rollouts == 4 and report.window_s > 0 and report.samples_per_s > 0
        assert report.runs_samples_per_s == [report.samples_per_s]
        assert report.runs_reached == int(report.time_to_target_s is not None)
        assert report.time_to_target_s is None or report.time_to_target_s > 0
        assert 0.0 <= report.trainer_idle <= 1.0 and 0.0 <= report.rollouter_idle <= 1.0
        assert 0.0 <= report.stale_dropped < 1.0
        assert 0.0 <= report.staleness_mean <= report.staleness_max <= BOUNDS[report.mode]
        assert report.generate_s > 0 and report.train_call_s >= report.train_s > 0
        assert all(math.isfinite(value) for value in report.correction.values())
        assert {"is/kl_k3", "is/ess_token"} <= set(report.correction)
        assert 0.0 < report.correction["is/ess_token"] <= 1.0 + 1e-6
    assert 1.0 <= ideal_speedup(standard.reports[0]) <= 2.0

    from fasync.bench.modes import speedups

    for scenario in results:
        for numbers in speedups(scenario).values():
            assert numbers["throughput_speedup"] > 0 and numbers["throughput_of_ideal"] > 0

    assert set(blocks) == {"setup", "modes", "overlap", "long-tail"}
    text = doc.read_text()
    for name in blocks:
        assert f"<!-- bench-{name}:begin -->" in text
    assert "fasync bench tiny.yaml" in text and "nan" not in text.lower()
    assert (tmp_path / "runs" / "report.json").exists()
    # The curves beside the tables: `fasync report` over each variant's run, embedded in the blocks.
    for scenario, block in (("modes", "modes"), ("long-tail", "long-tail")):
        charts = tmp_path / "benchmarks" / scenario
        for name in ("reward", "staleness", "queue", "correction", "time"):
            assert (charts / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert f"![{name}](benchmarks/{scenario}/{name}.png)" in blocks[block]
        report = (charts / "report.md").read_text()
        for variant in (standard if scenario == "modes" else long_tail).scenario.variants:
            assert f"**{variant.label}**" in report
