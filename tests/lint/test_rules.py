"""The lint rules: every rule's examples, the numbers its messages state, and the shipped configs.

Each rule's examples live once, in fasync/diagnostics/examples (the docs render the same files):
<CODE>_bad.yaml sets the offending key on the line marked `# <- CODE`, must be reported there and by
that rule alone; <CODE>_good.yaml is the fixed config and must be clean.
"""

import json
import math
import re
import typing
from pathlib import Path

import pytest
from paths import REPO
from typer.testing import CliRunner

from fasync.cli import app
from fasync.config.loader import load_config
from fasync.config.schema import RolloutConfig
from fasync.data.rewards import BUILTIN_REWARDS
from fasync.data.shape import TaskShape, builtin_task_shape
from fasync.data.tasks import TASKS
from fasync.diagnostics import EXAMPLES, Severity
from fasync.lint.engine import catalogue, lint, rules
from fasync.lint.rules import FAMILIES, facts

SHIPPED = sorted((REPO / "configs").rglob("*.yaml"))  # the simulate examples too
CODES = sorted(rules())


def findings(path: Path, overrides=(), code: str | None = None):
    result = load_config(path, overrides)
    assert result.config is not None, [d.message for d in result.diagnostics]
    return [d for d in lint(result) if code is None or d.code == code]


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_the_catalogue():
    assert len(CODES) >= 24
    for code, entry in rules().items():
        assert re.fullmatch(r"[A-Z]\d{3}", code) and code[0] in FAMILIES, code
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", entry.name), entry.name
        for text in (entry.summary, entry.what, entry.why, entry.bad_example, entry.good_example):
            assert text.strip(), code
    names = [entry.name for entry in rules().values()]
    assert len(set(names)) == len(names)
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == {f"{code}_{kind}.yaml" for code in catalogue()
                                                          for kind in ("bad", "good")}


@pytest.mark.parametrize("code", CODES)
def test_bad_example_is_reported_at_the_offending_key_and_alone(code):
    path = EXAMPLES / f"{code}_bad.yaml"
    lines = path.read_text().splitlines()
    marked = [number for number, line in enumerate(lines, start=1) if line.endswith(f"# <- {code}")]
    assert len(marked) == 1, f"{path.name} must mark its offending line with `# <- {code}`"
    found = findings(path)
    assert {d.code for d in found} == {code}, "the failing example should show this rule alone"
    located = [d for d in found if d.location.file == str(path) and d.location.line == marked[0]]
    assert located, [(d.key, d.location) for d in found]
    key = located[0].key.rsplit(".", 1)[-1]
    assert lines[marked[0] - 1].lstrip().startswith(f"{key}:"), (key, lines[marked[0] - 1])
    assert all(d.severity is rules()[code].severity and d.help for d in found)


# F000's example is a description (any config that makes a rule raise), not a config that shows it.
@pytest.mark.parametrize("code", sorted(set(catalogue()) - {"F000"}))
def test_bad_example_output_matches_its_snapshot(code, snapshot, monkeypatch):
    """What `fasync check <CODE>_bad.yaml` prints (text format, no colour) and its exit code, for every rule
    and load problem: tests/lint/__snapshots__/test_rules.ambr holds them, so that a change of wording is reviewed
    as a diff. After an intended change: `pytest tests/lint/test_rules.py --snapshot-update`, and review the diff."""
    # From the repository's root, as a user there names the file (M005's model path is relative to it): the
    # output then holds no path of this machine.
    monkeypatch.chdir(REPO)
    name = str((EXAMPLES / f"{code}_bad.yaml").relative_to(REPO))
    result = CliRunner().invoke(app, ["check", name], env={"NO_COLOR": "1"})
    assert f"$ fasync check {name}\n{result.output}(exit {result.exit_code})\n" == snapshot


@pytest.mark.parametrize("code", CODES)
def test_good_example_is_clean(code):
    assert findings(EXAMPLES / f"{code}_good.yaml") == []


@pytest.mark.parametrize("code", ["F002", "F003", "F006", "F007", "F008", "F009", "F010"])
def test_load_problem_examples_are_reported_and_fixed(code):
    assert code in {d.code for d in load_config(EXAMPLES / f"{code}_bad.yaml").diagnostics}
    fixed = {d.code for d in load_config(EXAMPLES / f"{code}_good.yaml").diagnostics}
    assert fixed == ({"F001"} if code == "F010" else set())  # F010's fix names base files that are not there


def _message(code: str, text: str, tmp_path: Path, overrides=()) -> str:
    (diagnostic,) = findings(config_file(tmp_path, text), overrides, code=code)
    return diagnostic.message


FULLY_ASYNC = "mode: fully_async\nrollout:\n  batch_size: 32\n  n_samples_per_prompt: 8\ncorrection:\n  level: token\n"


# The lag is (staleness + 1) × interval × steps − 1 optimizer steps, never versions plus steps. S001_bad.yaml's
# case (fully_async, staleness 2, 4 steps per drain: 11 optimizer steps) is in its snapshot.
@pytest.mark.parametrize("mode, staleness, overrides, steps, lag, one_step", [
    ("fully_async", 1, ["train.global_batch_size=128"], 2,
     "3 optimizer steps (1.5 versions), (staleness 1 + 1) × interval 1 × 2 steps per drain − 1", "1 optimizer step"),
    # Each of 2 epochs takes the drain's 2 steps again: (1 + 1) × 1 × 2 × 2 − 1; one step per drain, 2 epochs: 3.
    ("fully_async", 1, ["train.global_batch_size=128", "train.ppo_epochs=2"], 2,
     "7 optimizer steps (1.75 versions), (staleness 1 + 1) × interval 1 × 2 steps per drain × 2 epochs − 1",
     "3 optimizer steps (1.5 versions)"),
    ("async", 3, ["train.global_batch_size=64", "train.micro_batch_size=32", "train.num_steps_per_rollout=2"], 2,
     "7 optimizer steps (3.5 versions), (staleness 3 + 1) × interval 1 × 2 steps per rollout − 1", "3 optimizer steps"),
])
def test_multi_step_staleness_states_the_worst_lag_in_optimizer_steps(mode, staleness, overrides, steps, lag,
                                                                     one_step, tmp_path):
    text = FULLY_ASYNC.replace("fully_async", mode) + f"async:\n  max_weight_staleness: {staleness}\n"
    message = _message("S001", text, tmp_path, overrides)
    per = "drain" if mode == "fully_async" else "rollout"
    assert f"{steps} optimizer steps per {per}" in message
    assert f"the worst policy lag is {lag}, where one step per {per} would give {one_step}" in message


def test_the_issue_example_lags_eleven_optimizer_steps(tmp_path):
    text = ("mode: fully_async\nrollout:\n  batch_size: 16\n  n_samples_per_prompt: 8\ntrain:\n  global_batch_size: 32\n"
            "  micro_batch_size: 32\nasync:\n  max_weight_staleness: 2\ncorrection:\n  level: token\n")
    assert "the worst policy lag is 11 optimizer steps (2.75 versions)" in _message("S001", text, tmp_path)


def test_sync_interval_states_the_lag_in_optimizer_steps(tmp_path):
    # S007_bad.yaml (one step per rollout: 7 optimizer steps) is in its snapshot; here two steps per rollout.
    text = "mode: async\nasync:\n  max_weight_staleness: 1\n  update_weights_interval: 4\ncorrection:\n  level: token\n"
    with_steps = _message("S007", text, tmp_path, ["train.global_batch_size=128"])
    assert "(8 optimizer steps)" in with_steps and "15 optimizer steps (1.875 versions)" in with_steps
    # Three epochs of those two steps: a version spans 4 × 2 × 3 = 24 steps, the lag (1 + 1) × 24 − 1.
    with_epochs = _message("S007", text, tmp_path, ["train.global_batch_size=128", "train.ppo_epochs=3"])
    assert "(24 optimizer steps)" in with_epochs and "47 optimizer steps (1.95833 versions)" in with_epochs


def test_epochs_state_the_lag_they_add_in_optimizer_steps(tmp_path):
    # S009_bad.yaml (one step per rollout, 2 epochs: 3 against 1) is in its snapshot; here 3 epochs of 2 steps.
    text = "mode: fully_async\nasync:\n  max_weight_staleness: 2\ncorrection:\n  level: token\n"
    message = _message("S009", text, tmp_path, ["train.global_batch_size=128", "train.ppo_epochs=3"])
    assert "each drain takes 6 optimizer steps" in message
    assert "the worst policy lag is 17 optimizer steps (2.83333 versions)" in message
    assert "against 5 optimizer steps (2.5 versions) with one epoch" in message
    assert findings(config_file(tmp_path, text), ["train.ppo_epochs=3", "mode=sync"], code="S009") == []


@pytest.mark.parametrize("text, overrides, age", [
    ("mode: async\ncorrection:\n  ratio_anchor: proximal\n", [], "with a worst policy lag of 1 optimizer step"),
    ("mode: async\ncorrection:\n  ratio_anchor: proximal\n", ["train.global_batch_size=128"],
     "with a worst policy lag of 3 optimizer steps (1.5 versions), (staleness 1 + 1) × interval 1 × 2 steps per rollout − 1"),
    ("mode: sync\ncorrection:\n  level: none\n  ratio_anchor: proximal\n", ["train.global_batch_size=64"],
     "with a worst policy lag of 3 optimizer steps (0.75 versions), 4 steps per rollout − 1"),
    ("mode: async\nasync:\n  max_weight_staleness: null\ncorrection:\n  ratio_anchor: recompute\n", [],
     "with unbounded staleness"),
])
def test_uncorrected_staleness_states_the_lag_in_optimizer_steps(text, overrides, age, tmp_path):
    assert _message("C004", text, tmp_path, overrides).endswith(age)


def test_sliced_completions_state_the_lag_a_raised_bound_costs(tmp_path):
    text = ("mode: fully_async\nrollout:\n  max_new_tokens: 24\ncorrection:\n  level: token\n"
            "async:\n  partial_rollout: true\n  max_weight_staleness: 2\n  tokens_per_call: 4\n")
    (diagnostic,) = findings(config_file(tmp_path, text), ["train.global_batch_size=128"], code="S008")
    assert ("`async.max_weight_staleness: 6` (a worst policy lag of 13 optimizer steps (6.5 versions), against 5 "
            "optimizer steps (2.5 versions) now)") in diagnostic.help


def test_multi_step_staleness_is_a_warning_with_fixes_that_fit_the_mode(tmp_path):
    path = config_file(tmp_path, FULLY_ASYNC + "async:\n  max_weight_staleness: 2\ntrain:\n  global_batch_size: 64\n")
    (diagnostic,) = findings(path, code="S001")
    assert diagnostic.severity is Severity.WARNING
    assert diagnostic.help == ("set `rollout.batch_size: 8` (= global batch 64 / 8 samples per prompt: each drain is "
                               "one step of the same 64 samples); or set `train.global_batch_size: 256` (= samples "
                               "per drain: the whole drain is one step)")  # no dynamic batch: redundant here (S002)
    (in_async,) = findings(path, ["mode=async"], code="S001")
    assert in_async.help.endswith("or set `train.use_dynamic_global_batch_size: true` and remove "
                                  "`train.global_batch_size` (every rollout is one step, whatever its size)")
    assert findings(path, ["mode=sync"], code="S001") == []


def test_several_steps_per_drain_without_a_bound_warn_too(tmp_path):
    path = config_file(tmp_path, FULLY_ASYNC + "async:\n  max_weight_staleness: null\ntrain:\n  global_batch_size: 64\n")
    (diagnostic,) = findings(path, code="S001")
    assert diagnostic.severity is Severity.WARNING
    assert ("4 optimizer steps per drain (256 samples / global batch 64): with no staleness bound "
            "(`async.max_weight_staleness` null) the policy lag is unbounded") in diagnostic.message
    assert findings(path, ["mode=async"], code="S001")


def test_a_fix_that_would_add_a_warning_is_not_offered(tmp_path):
    # Four engines and 8 prompts per rollout: shrinking the rollout to 2 prompts would idle two engines (R004).
    text = ("mode: async\nrollout:\n  batch_size: 8\n  n_samples_per_prompt: 8\ntrain:\n  global_batch_size: 16\n"
            "resources:\n  num_rollout_engines: 4\ncorrection:\n  level: token\n")
    (diagnostic,) = findings(config_file(tmp_path, text), code="S001")
    assert "rollout.batch_size" not in diagnostic.help and "`train.global_batch_size: 64`" in diagnostic.help


@pytest.mark.parametrize("bound, per_call, policy, calls, fix", [
    (2, 4, "drop", 6, "`async.tokens_per_call: 12` or more (at most 2 calls per completion)"),
    (1, 12, "regenerate", 2, "`async.tokens_per_call: 24` or more"),
    (0, 24, "drop", 1, "set `async.max_weight_staleness: 1`"),
])
def test_sliced_completions_outliving_the_bound_state_the_calls_and_the_fix(bound, per_call, policy, calls, fix,
                                                                             tmp_path):
    text = ("mode: fully_async\nrollout:\n  max_new_tokens: 24\ncorrection:\n  level: token\n"
            f"async:\n  partial_rollout: true\n  max_weight_staleness: {bound}\n  tokens_per_call: {per_call}\n"
            f"  stale_policy: {policy}\n")
    (diagnostic,) = findings(config_file(tmp_path, text), code="S008")
    assert f"takes {calls} call{'s' if calls > 1 else ''} of `async.tokens_per_call` {per_call}" in diagnostic.message
    assert f"reaches staleness {calls}" in diagnostic.message
    assert ("regenerated" if policy == "regenerate" else "dropped") in diagnostic.message
    assert fix in diagnostic.help and f"`async.max_weight_staleness: {calls}`" in diagnostic.help
    path = config_file(tmp_path, text.replace(f"tokens_per_call: {per_call}", "tokens_per_call: 24"))
    assert bound == 0 or findings(path, code="S008") == []
    assert findings(config_file(tmp_path, text), ["async.partial_rollout=false"], code="S008") == []
    assert "`async.stale_policy: wait`" in diagnostic.help
    assert findings(config_file(tmp_path, text), ["async.stale_policy=wait"], code="S008") == []


@pytest.mark.parametrize("overrides, fires", [
    ([], True),
    (["async.stale_policy=regenerate"], True),
    (["async.stale_policy=wait"], False),
    (["async.partial_rollout=false"], False),  # a sync waits for the requests: nothing goes past the bound in flight
    (["rollout.engine=hf"], False),  # calls, not streamed requests: S008 states the sliced case
    (["async.max_weight_staleness=null"], False),  # nothing is ever too stale (S003)
])
def test_streamed_stale_drops_are_stated_as_a_length_bias_unless_the_drains_wait(tmp_path, overrides, fires):
    text = ("mode: fully_async\nmodel:\n  path: /models/Qwen2.5-0.5B-Instruct\nrollout:\n  engine: vllm\n"
            "correction:\n  level: token\n"
            "async:\n  max_weight_staleness: 2\n  partial_rollout: true\n")
    found = findings(config_file(tmp_path, text), overrides, code="S010")
    assert bool(found) is fires
    if fires:
        (diagnostic,) = found
        assert diagnostic.key == "async.stale_policy" and "longest completions" in diagnostic.message
        assert ("regenerated" if overrides else "dropped") in diagnostic.message
        assert "`async.stale_policy: wait`" in diagnostic.help


@pytest.mark.parametrize("batch, samples_per_prompt, global_batch, trimmed, total, percent, steps", [
    (32, 8, 192, 64, 256, "25.0", 1),
    (30, 8, 64, 48, 240, "20.0", 3),
    (10, 5, 16, 2, 50, "4.0", 3),
])
def test_trimming_states_how_many_and_what_fraction(batch, samples_per_prompt, global_batch, trimmed, total, percent,
                                                    steps, tmp_path):
    text = (f"rollout:\n  batch_size: {batch}\n  n_samples_per_prompt: {samples_per_prompt}\n"
            f"train:\n  global_batch_size: {global_batch}\n  micro_batch_size: {global_batch}\n")
    message = _message("B004", text, tmp_path)
    assert message.startswith(f"{trimmed} of the {total} samples of each rollout ({percent}%)")
    assert f"{steps} step{'s' if steps > 1 else ''} × global batch {global_batch} = {total - trimmed}" in message


def test_trimming_by_explicit_steps_points_at_them(tmp_path):
    path = config_file(tmp_path, "train:\n  global_batch_size: 64\n  num_steps_per_rollout: 2\n")
    (diagnostic,) = findings(path, code="B004")
    assert diagnostic.key == "train.num_steps_per_rollout"
    assert diagnostic.message.startswith("128 of the 256 samples of each rollout (50.0%)")


def test_ignored_settings_are_only_those_written(tmp_path):
    assert findings(config_file(tmp_path, "mode: sync\n"), code="U001") == []
    path = config_file(tmp_path, "mode: sync\nasync:\n  update_weights_interval: 1\n  partial_rollout: true\n")
    assert sorted(d.key for d in findings(path, code="U001")) == ["async.partial_rollout",
                                                                   "async.update_weights_interval"]


def test_pause_mode_counts_only_for_requests_streamed_with_partial_rollout(tmp_path):
    text = ("mode: fully_async\nmodel:\n  path: /models/Qwen2.5-0.5B-Instruct\nrollout:\n  engine: vllm\n"
            "correction:\n  level: token\nasync:\n  partial_rollout: true\n  pause_mode: keep\n")
    path = config_file(tmp_path, text)
    assert findings(path, code="U001") == []
    why = {
        "async.partial_rollout=false": "there are none to abort or keep",
        "rollout.engine=hf": "the torch engine generates closed batches",
        "rollout.function=my_agent:run": "agentic rollouts reach the engine through generate calls",
        "mode=async": "only the fully_async rollouter",
    }
    for override, reason in why.items():
        overrides = [override, "model.path=null"] if override == "rollout.engine=hf" else [override]
        (diagnostic,) = [d for d in findings(path, overrides, code="U001") if d.key == "async.pause_mode"]
        assert reason in diagnostic.message, (override, diagnostic.message)


def test_tokens_per_call_counts_only_with_partial_rollout(tmp_path):
    path = config_file(tmp_path, "mode: fully_async\nasync:\n  tokens_per_call: 4\n")
    assert [d.key for d in findings(path, code="U001")] == ["async.tokens_per_call"]
    assert findings(path, ["async.partial_rollout=true"], code="U001") == []


def test_tokens_per_call_is_ignored_by_the_vllm_engine_which_streams(tmp_path):
    text = ("mode: fully_async\nmodel:\n  path: /models/Qwen2.5-0.5B-Instruct\nrollout:\n  engine: vllm\n"
            "  max_new_tokens: 24\ncorrection:\n  level: token\n"
            "async:\n  partial_rollout: true\n  max_weight_staleness: 2\n  tokens_per_call: 4\n")
    path = config_file(tmp_path, text)
    (diagnostic,) = findings(path, code="U001")
    assert diagnostic.key == "async.tokens_per_call" and "continuous batching" in diagnostic.message
    assert "`rollout.engine: hf`" in diagnostic.help
    # No calls, so no completion outlives the bound by its slices (S008 fires for the torch engine).
    assert findings(path, code="S008") == []
    torch_engine = ["rollout.engine=hf", "model.path=null"]
    assert findings(path, torch_engine, code="U001") == [] and findings(path, torch_engine, code="S008")
    # The vLLM engine slices nothing in the other modes either, where U001 already says so.
    assert [d.key for d in findings(path, ["mode=async"], code="U001")].count("async.tokens_per_call") == 1


def test_gpu_demand_of_colocated_actors_is_the_larger_share(tmp_path):
    text = ("resources:\n  num_gpus: 2\n  num_rollout_engines: 2\n  gpus_per_engine: 1\n  trainer_ranks: 2\n"
            "  gpus_per_trainer_rank: 1\n")
    path = config_file(tmp_path, text)
    assert "ask for 4 GPUs" in findings(path, code="R001")[0].message
    assert findings(path, ["resources.colocate=true"], code="R001") == []
    assert findings(path, ["resources.num_gpus=null", "resources.ray_address=ray://head:10001"], code="R001") == []


def test_the_tables_cover_every_engine_and_reward():
    engines = typing.get_args(RolloutConfig.model_fields["engine"].annotation)
    assert set(facts.BEHAVIOUR_LOGPROB_TRANSFORMS) == set(engines)
    assert set(facts.REWARD_RANGES) == set(BUILTIN_REWARDS)
    vllm_engine = (REPO / "fasync" / "rollout" / "vllm_engine.py").read_text()
    assert 'logprobs_mode="processed_logprobs"' in vllm_engine  # what the table says vLLM returns


@pytest.mark.parametrize("task, length, prompt_tokens, answer_tokens", [
    ("reverse", 6, 8, 6), ("copy", 3, 5, 3), ("sort", 10, 12, 10), ("add", 4, 11, 5),
])
def test_builtin_task_shape(task, length, prompt_tokens, answer_tokens, tmp_path):
    assert set(TASKS) == {"reverse", "copy", "sort", "add"}
    config = load_config(config_file(tmp_path, f"data:\n  task: {task}\n  length: {length}\n")).config
    assert builtin_task_shape(config) == TaskShape(task, prompt_tokens, answer_tokens)
    with_file = load_config(config_file(tmp_path, "data:\n  path: prompts.jsonl\n")).config
    assert builtin_task_shape(with_file) is None


@pytest.mark.parametrize("path", [p for p in SHIPPED if not p.name.startswith("diagnostic-")], ids=lambda p: p.name)
def test_shipped_configs_pass_strict(path):
    result = CliRunner().invoke(app, ["check", "--strict", str(path)])
    assert result.exit_code == 0, result.stdout


@pytest.mark.parametrize("path", [p for p in SHIPPED if p.name.startswith("diagnostic-")], ids=lambda p: p.name)
def test_diagnostic_configs_show_a_finding(path):
    assert findings(path)
    assert CliRunner().invoke(app, ["check", "--strict", str(path)]).exit_code == 1


@pytest.mark.parametrize("mask", ["reject_token_ratio: [0.5, 2.0]", "reject_sequence_ratio: [0.5, 2.0]", "reject_kl: 0.1"])
def test_rejection_counts_as_correction(mask, tmp_path):
    partial = "mode: fully_async\nasync:\n  partial_rollout: true\ncorrection:\n  ratio_anchor: proximal\n"
    assert [d.code for d in findings(config_file(tmp_path, partial))] == ["S005"]
    assert findings(config_file(tmp_path, partial + f"  {mask}\n")) == []
    stale = "mode: async\ncorrection:\n  ratio_anchor: proximal\n"
    assert [d.code for d in findings(config_file(tmp_path, stale))] == ["C004"]
    assert findings(config_file(tmp_path, stale + f"  {mask}\n")) == []


@pytest.mark.parametrize("text, anchor", [
    ("mode: sync\n", "recompute"),
    ("mode: async\n", "behaviour"),
    ("mode: fully_async\n", "behaviour"),
    ("mode: async\ncorrection:\n  level: token\n", "proximal"),
    ("mode: fully_async\ncorrection:\n  level: sequence\n", "proximal"),
])
def test_the_default_anchor_is_one_the_linter_calls_clean(text, anchor, tmp_path):
    from fasync.config.derived import derive

    path = config_file(tmp_path, text)
    assert derive(load_config(path).config).ratio_anchor == anchor
    assert findings(path) == []


@pytest.mark.parametrize("train, ranks, batch, micro, steps", [
    ({}, 1, 256, 256, 1),
    ({"global_batch_size": 64}, 2, 64, 32, 4),
    ({"num_steps_per_rollout": 2}, 1, 128, 128, 2),
    ({"global_batch_size": 64, "micro_batch_size": 16}, 2, 64, 16, 4),
    ({"use_dynamic_global_batch_size": True}, 4, 256, 64, 1),
])
def test_batch_defaults_are_derived(train, ranks, batch, micro, steps, tmp_path):
    from fasync.config.derived import derive

    text = "resources:\n  trainer_ranks: %d\n" % ranks + ("train:\n" + "".join(
        f"  {k}: {str(v).lower()}\n" for k, v in train.items()) if train else "")
    derived = derive(load_config(config_file(tmp_path, text)).config)
    assert (derived.effective_global_batch_size, derived.micro_batch_size, derived.num_steps_per_rollout) == (
        batch, micro, steps)
    assert derived.micro_batches_per_step == batch // ranks // micro


# -- A004, A005: configs that learn nothing (issue 19 §4) ------------------------------------------


@pytest.mark.parametrize("temperature, reported", [(1e-9, True), (0.0119, True), (0.0121, False), (0.7, False),
                                                   (0.0, False)])  # 0 itself is A002's
def test_near_greedy_grpo_fires_where_a_group_expects_under_a_hundredth_of_a_differing_token(tmp_path, temperature,
                                                                                              reported):
    path = config_file(tmp_path, "rollout:\n  n_samples_per_prompt: 8\n  max_new_tokens: 6\n")
    assert bool(findings(path, [f"rollout.temperature={temperature}"], code="A004")) == reported


def test_near_greedy_states_its_arithmetic(tmp_path):
    path = config_file(tmp_path, "rollout:\n  n_samples_per_prompt: 4\n  max_new_tokens: 10\n")
    (diagnostic,) = findings(path, ["rollout.temperature=0.01"], code="A004")
    assert "probability 4.5e-05, so over 3 more completions of 10 tokens a group expects at most 0.0014" in \
        diagnostic.message
    assert "below 0.012 this group size" in diagnostic.help  # 30 positions: 0.1 / ln(0.99 / (0.01 / 30))
    for overrides in (["train.advantage_estimator=reinforce_baseline"], ["rollout.n_samples_per_prompt=1"]):
        assert findings(path, ["rollout.temperature=0.01", *overrides], code="A004") == []


def test_the_learning_rate_trend_reproduces_its_source():
    from fasync.lint.rules.algorithm import GPT3_PEAK_LEARNING_RATES, peak_learning_rate

    for parameters, rate in GPT3_PEAK_LEARNING_RATES:
        assert peak_learning_rate(parameters) == pytest.approx(rate)
    assert peak_learning_rate(500e6) == pytest.approx(3e-4 * (2.5 / 3) ** (math.log(500 / 350) / math.log(760 / 350)))
    # Beyond the table: ten times the rate per the table's end-to-end ratio of sizes (1,400×) fewer parameters.
    assert peak_learning_rate(125e6 / 1400) == pytest.approx(6e-3)
    assert peak_learning_rate(175e9 * 1400) == pytest.approx(6e-6)


# lr 10 is A005_bad.yaml, whose message is in its snapshot; here the range's edges.
@pytest.mark.parametrize("lr, reported", [(0.06, True), (0.05, False), (2e-3, False), (6e-7, False), (5e-7, True)])
def test_learning_rate_range_of_the_embedded_model(tmp_path, lr, reported):
    path = config_file(tmp_path, "model:\n  n_layers: 2\n  d_model: 64\n")  # 105k parameters: peak 0.0057
    found = findings(path, [f"train.lr={lr}"], code="A005")
    assert bool(found) == reported
    if found:
        assert "105k parameters (the embedded model)" in found[0].message
        assert "Brown et al. 2020, Table 2.1" in found[0].message and "5.7e-07 to 0.057" in found[0].message


def test_learning_rate_range_of_a_hugging_face_model_comes_from_its_config(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({  # a Qwen2.5-7B-sized decoder: 7.6B parameters
        "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
        "intermediate_size": 18944, "vocab_size": 152064, "num_hidden_layers": 28, "max_position_embeddings": 32768}))
    path = config_file(tmp_path, f"model:\n  path: {model}\n")
    (diagnostic,) = findings(path, ["train.lr=0.01"], code="A005")
    assert "7.62B parameters" in diagnostic.message and "the range for this model is 1.2e-08 to 0.0012" in \
        diagnostic.message
    assert findings(path, ["train.lr=1e-6"], code="A005") == []


@pytest.mark.parametrize("overrides, reported", [
    (["rollout.temperature=0"], True),
    (["rollout.temperature=0", "rollout.n_samples_per_prompt=1"], True),  # greedy: nothing explores either way
    (["rollout.temperature=1e-9"], True),
    (["rollout.temperature=0.0117"], True),  # 8 × 6 = 48 sampled tokens per prompt: the bound needs 0.0118
    (["rollout.temperature=0.0119"], False),
    (["rollout.temperature=0", "train.advantage_estimator=grpo"], False),  # A002's
])
def test_greedy_reinforce_baseline_warns_where_no_sample_leaves_the_greedy_path(tmp_path, overrides, reported):
    path = config_file(tmp_path, "rollout:\n  n_samples_per_prompt: 8\n  max_new_tokens: 6\n"
                                 "train:\n  advantage_estimator: reinforce_baseline\n")
    assert bool(findings(path, overrides, code="A006")) == reported
