"""Evaluation on held-out prompts (fasync/eval) and the samples a user can read (samples.jsonl): pass@k against
hand-computed values, the eval set, and whole runs in sync and fully_async that evaluate every N steps, then
`fasync eval` on the finished run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sections import tiny_config, tiny_sections

from fasync.data.datasets import PromptDataset
from fasync.data.held_out import build_eval_prompts, split_held_out
from fasync.data.tasks import Problem
from fasync.errors import ConfigurationError
from fasync.eval.scores import PromptResult, eval_metrics, metric_source, pass_at_k
from fasync.metrics.registry import UnregisteredMetric, check_row, metric_for
from fasync.metrics.samples import pick, sample_rows

# -- pass@k ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (4, 1, 1, 1 / 4),      # 1 − C(3,1)/C(4,1) = 1 − 3/4
    (4, 1, 2, 1 / 2),      # 1 − C(3,2)/C(4,2) = 1 − 3/6
    (5, 2, 3, 9 / 10),     # 1 − C(3,3)/C(5,3) = 1 − 1/10
    (10, 3, 5, 11 / 12),   # 1 − C(7,5)/C(10,5) = 1 − 21/252
    (4, 0, 4, 0.0),        # nothing correct
    (4, 3, 2, 1.0),        # n − c < k: every draw of 2 holds a correct one
    (4, 4, 4, 1.0),
])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    # The estimate is one division of exact integers: equal to the hand-computed fraction up to one rounding.
    assert pass_at_k(n, c, k) == pytest.approx(expected, rel=1e-15, abs=0)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_eval_metrics_overall_and_per_data_source():
    # Each figure is a few sums of small fractions and one division: equal to the hand value up to roundings (rel=1e-15).
    results = [
        PromptResult([1.0, 0.0, 0.0, 0.0], "gsm8k", [3, 4, 5, 4]),  # c=1
        PromptResult([1.0, 1.0, 0.5, 0.0], "gsm8k", [2, 2, 2, 2]),  # c=2 (0.5 is below correct_reward 1)
        PromptResult([0.0, 0.0, 0.0, 0.0], "math/algebra", [4, 4, 4, 4]),  # c=0
    ]
    metrics = eval_metrics(results, k=2, correct_reward=1.0)
    # pass@2 per prompt: 1 − C(3,2)/C(4,2) = 1/2; 1 − C(2,2)/C(4,2) = 5/6; 0.
    assert metrics["eval/pass@k"] == pytest.approx((1 / 2 + 5 / 6 + 0) / 3, rel=1e-15)
    assert metrics["eval/mean@k"] == pytest.approx((1 / 4 + 2 / 4 + 0) / 3, rel=1e-15)
    assert metrics["eval/reward_mean"] == pytest.approx(3.5 / 12, rel=1e-15)
    assert metrics["eval/prompts"] == 3 and metrics["eval/response_length_mean"] == pytest.approx(40 / 12, rel=1e-15)
    assert metrics["eval/gsm8k/pass@k"] == pytest.approx((1 / 2 + 5 / 6) / 2, rel=1e-15)
    assert metrics["eval/gsm8k/prompts"] == 2
    assert metrics["eval/math_algebra/pass@k"] == 0.0 and metrics["eval/math_algebra/reward_mean"] == 0.0


def test_without_data_sources_only_the_overall_figures():
    metrics = eval_metrics([PromptResult([1.0, 0.0])], k=1, correct_reward=0.5)
    assert set(metrics) == {"eval/prompts", "eval/reward_mean", "eval/mean@k", "eval/pass@k"}


def test_per_source_keys_are_registered_and_others_are_not():
    assert metric_for("eval/gsm8k/pass@k").unit == "fraction"
    assert metric_for(f"eval/{metric_source('a b/c')}/mean@k") is not None
    check_row({"step": 0, "eval/gsm8k/pass@k": 0.5, "eval/pass@k": 0.5}, "fully_async")
    with pytest.raises(UnregisteredMetric):
        check_row({"eval/gsm8k/accuracy": 0.5}, "sync")


# -- the eval set -----------------------------------------------------------------------------------------------


def test_held_out_prompts_leave_training_and_the_split_is_the_same_every_time():
    dataset = PromptDataset([Problem(str(i), str(i)) for i in range(10)], "pool")
    train, held = split_held_out(dataset, 3, seed=5)
    again = split_held_out(dataset, 3, seed=5)
    assert len(train) == 7 and len(held) == 3
    assert {p.prompt for p in train.problems}.isdisjoint(p.prompt for p in held.problems)
    assert [p.prompt for p in held.problems] == [p.prompt for p in again[1].problems]
    with pytest.raises(ConfigurationError, match="eval.held_out_prompts: 10 would hold out every prompt"):
        split_held_out(dataset, 10, seed=5)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def test_eval_file_carries_each_records_data_source(tmp_path):
    from fasync.model import build_tokenizer

    path = write_jsonl(tmp_path / "eval.jsonl", [{"prompt": "123=", "label": "321", "data_source": "rev"},
                                                 {"prompt": "456=", "label": "654"},
                                                 {"prompt": "789=", "label": "987", "data_source": "rev"}])
    cfg = tiny_config(eval={"path": str(path), "every": 2, "max_prompts": 2})
    prompts = build_eval_prompts(cfg, build_tokenizer(cfg.model, cfg.data), None)
    assert [p.prompt for p in prompts.dataset.problems] == ["123=", "456="]
    assert prompts.data_sources == ["rev", None]


def test_evaluation_without_an_eval_set_is_refused_in_one_line():
    from fasync.model import build_tokenizer

    cfg = tiny_config(eval={"every": 2})
    with pytest.raises(ConfigurationError, match="set eval.path .* or eval.held_out_prompts"):
        build_eval_prompts(cfg, build_tokenizer(cfg.model, cfg.data), None)


def test_pass_k_above_the_samples_is_a_config_error():
    with pytest.raises(ValueError, match="eval.pass_k 5 is above eval.samples_per_prompt 4"):
        tiny_config(eval={"samples_per_prompt": 4, "pass_k": 5})


# -- samples ------------------------------------------------------------------------------------------------------


def test_samples_are_spread_over_the_groups():
    from fasync.rollout.types import GroupId, Sample

    class Group:
        def __init__(self, draw):
            self.group_id, self.prompt = GroupId(draw), f"p{draw}"
            self.samples = [Sample(GroupId(draw), [1], [2], [0.0], [draw], reward=i, label="l", completion=f"c{i}")
                            for i in range(3)]

    groups = [Group(0), Group(1)]
    assert [(g.group_id.draw, s.reward) for g, s in pick(groups, 3)] == [(0, 0), (1, 0), (0, 1)]
    rows = sample_rows(groups, 2, step=7, rollout=3, version=1)
    assert rows[1] == {"step": 7, "rollout": 3, "group": "1.0", "prompt": "p1", "completion": "c0", "reward": 0,
                       "label": "l", "finish_reason": None, "version": 1, "staleness": 0}
    assert rows[0]["staleness"] == 1  # generated by version 0, trained at version 1


# -- whole runs ---------------------------------------------------------------------------------------------------


def reverse_records(count: int, seed: int) -> list[dict]:
    import random

    rng = random.Random(seed)
    records = []
    for index in range(count):
        digits = "".join(rng.choice("0123456789") for _ in range(3))
        records.append({"prompt": f"{digits}=", "label": digits[::-1],
                        "data_source": "even" if index % 2 == 0 else "odd"})
    return records


MODES = {
    "sync": {},
    "fully_async": {"async": {"max_weight_staleness": 2, "partial_rollout": True}},
}


def evaluating_run(tmp_path: Path, mode: str, **sections) -> Path:
    """A finished tiny run on a JSONL dataset that evaluated every 2 optimizer steps (2 per rollout) and before
    training, and wrote 3 samples every 2 steps; `sections` over its config."""
    from fasync.commands.train import run as train

    data = write_jsonl(tmp_path / "train.jsonl", reverse_records(64, seed=0))
    held = write_jsonl(tmp_path / "eval.jsonl", reverse_records(6, seed=1))
    raw = tiny_sections(mode=mode, data={"path": str(data)},
                        eval={"path": str(held), "every": 2, "before_train": True, "samples_per_prompt": 4,
                              "pass_k": 2},
                        logging={"progress": "none", "samples_every": 2, "samples_per_write": 3},
                        **{**MODES[mode], **sections})
    for key in ("task", "length"):
        raw["data"].pop(key)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    assert train(str(config), [], run_dir=str(out)) == 0
    return out


def eval_rows(out: Path) -> list[dict]:
    from fasync.metrics.writer import read_metrics

    return [row for row in read_metrics(out / "metrics.jsonl") if "eval/pass@k" in row]


@pytest.mark.ray
@pytest.mark.parametrize("mode", MODES)
def test_a_run_evaluates_every_n_steps_with_pass_at_k_in_metrics(ray_session, tmp_path, mode):
    out = evaluating_run(tmp_path, mode)
    rows = eval_rows(out)
    # 4 rollouts of 2 steps: the initial weights, then one evaluation per rollout (every 2 steps); the async
    # modes put each on the first row written after it finished, so some may share a rollout's two rows.
    versions = [row["eval/weight_version"] for row in rows]
    assert versions[0] == 0 and versions == sorted(versions)
    assert len(rows) >= (5 if mode == "sync" else 3), versions
    if mode == "sync":
        # In sync each evaluation runs once the rollout's weights are pushed: version r + 1 after rollout r.
        assert versions == [0, 1, 2, 3, 4]
    for row in rows:
        assert row["eval/prompts"] == 6
        assert 0.0 <= row["eval/mean@k"] <= row["eval/pass@k"] <= 1.0
        assert row["eval/even/prompts"] == 3 and row["eval/odd/prompts"] == 3
        assert row["eval/time_s"] > 0

    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval"] == {key: value for key, value in rows[-1].items() if key.startswith("eval/")}

    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 3  # every 2 steps, one rollout's worth
    assert [s["step"] for s in samples] == [step for step in (1, 3, 5, 7) for _ in range(3)]
    first = samples[0]
    assert set(first) == {"step", "rollout", "group", "prompt", "completion", "reward", "label", "finish_reason",
                          "version", "staleness"}
    trained = {json.loads(line)["prompt"]: json.loads(line)["label"]
               for line in (tmp_path / "train.jsonl").read_text().splitlines()}
    assert all(trained[s["prompt"]] == s["label"] for s in samples)
    bound = 0 if mode == "sync" else MODES[mode]["async"]["max_weight_staleness"]
    assert all(0 <= s["staleness"] <= bound for s in samples)

    # `fasync eval` on the finished run: its newest checkpoint, on its own eval set and on another file.
    from typer.testing import CliRunner

    from fasync.cli import app

    result = CliRunner().invoke(app, ["eval", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "eval" / "step_000008.json").read_text())
    assert report["eval/prompts"] == 6 and report["eval/weight_version"] == 4 and "eval/even/pass@k" in report
    assert "pass@2" in result.output
    other = write_jsonl(tmp_path / "other.jsonl", reverse_records(2, seed=3))
    result = CliRunner().invoke(app, ["eval", str(out), "--step", "8", "--data", str(other)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "eval" / "step_000008-other.json").read_text())["eval/prompts"] == 2


# -- the live display ---------------------------------------------------------------------------------------------


def test_the_display_keeps_a_reward_history_and_shows_the_latest_sample_at_verbose(capsys):
    import io

    from rich.console import Console

    from fasync.metrics.progress import Progress, sparkline

    sample = {"step": 3, "rollout": 1, "group": "5.0", "prompt": "123=", "completion": "321", "reward": 1.0,
              "label": "321", "finish_reason": "stop", "version": 1, "staleness": 0}
    progress = Progress(3, "plain", verbose=True)
    for step, (rollout, reward) in enumerate([(0, 0.0), (0, 0.0), (1, 0.5), (1, 0.5), (2, 1.0)]):
        progress.update({"step": step, "rollout": rollout, "rollout_reward_mean": reward})
    progress.sample(sample)
    assert list(progress.rewards) == [0.0, 0.5, 1.0]  # one per rollout, not per row
    assert capsys.readouterr().out.splitlines()[-1] == \
        "sample (step 3, version 1): '123=' → '321'  reward 1  label '321'"
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(progress._render({"step": 4, "rollout": 2, "rollout_reward_mean": 1.0}))
    shown = console.export_text()
    assert "reward history (0.000 … 1.000): ▁▅█" in shown and "'123=' → '321'" in shown
    assert sparkline([2.0, 2.0]) == "▁▁" and sparkline([]) == ""
    quiet = Progress(3, "plain")
    quiet.sample(sample)
    assert capsys.readouterr().out == "" and quiet.latest_sample is None


@pytest.mark.ray
def test_fasync_eval_of_an_export_matches_its_checkpoint_and_bad_input_is_one_line(ray_session, tmp_path):
    from typer.testing import CliRunner

    from fasync.cli import app

    out = evaluating_run(tmp_path, "sync")
    runner = CliRunner()
    assert runner.invoke(app, ["export", str(out), str(tmp_path / "exported")]).exit_code == 0
    result = runner.invoke(app, ["eval", str(out), "--export", str(tmp_path / "exported")])
    assert result.exit_code == 0, result.output
    assert f"the export {tmp_path / 'exported'} (step 8), weight version 4: 6 prompts" in result.output
    exported = json.loads((out / "eval" / "export.json").read_text())
    assert exported["eval/weight_version"] == 4 and exported["eval/prompts"] == 6

    result = runner.invoke(app, ["eval", str(out), "--export", str(tmp_path)])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "not a policy `fasync export` wrote" in result.output
    result = runner.invoke(app, ["eval", str(out), "--step", "3"])
    assert result.exit_code == 1 and "no checkpoint at step 3 (checkpoints at steps: 8)" in result.output
    result = runner.invoke(app, ["eval", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "not a fasync run directory" in result.output


def test_fasync_eval_of_a_lora_run_loads_its_merged_weights_and_refuses_an_adapter_alone(ray_session, tmp_path):
    from typer.testing import CliRunner

    from fasync.cli import app

    out = evaluating_run(tmp_path, "sync", model={**tiny_sections()["model"], "lora": {"rank": 4, "alpha": 8}})
    runner = CliRunner()
    # The checkpoint holds the adapters beside the frozen weights; the engine takes the merged ones, as in training.
    result = runner.invoke(app, ["eval", str(out)])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["export", str(out), str(tmp_path / "merged"), "--merge"]).exit_code == 0
    result = runner.invoke(app, ["eval", str(out), "--export", str(tmp_path / "merged")])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["export", str(out), str(tmp_path / "adapter")]).exit_code == 0
    result = runner.invoke(app, ["eval", str(out), "--export", str(tmp_path / "adapter")])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "a LoRA adapter without its model" in result.output and "--merge" in result.output
