"""Foreign keys: the hints checked against each framework's sources, a pasted config reported as one grouped
diagnostic and still linted, TOML and hydra spellings."""

import pytest
from typer.testing import CliRunner

from fasync.cli import app
from fasync.config.loader import load_config
from fasync.frameworks import FRAMEWORKS, TABLE, mappings_for
from fasync.lint.engine import lint

# A verl fully-async run as its users write it, from the keys verl documents for the recipe: 4 mini-batches of
# 32 prompts per fetch, 16 samples per prompt, a sync every 4 fetches, 50% extra samples allowed.
VERL_FULLY_ASYNC = """\
data:
  train_batch_size: 0
  max_response_length: 1024
actor_rollout_ref:
  actor:
    ppo_mini_batch_size: 32
    ppo_micro_batch_size_per_gpu: 4
    ppo_epochs: 1
    clip_ratio_low: 0.2
    clip_ratio_high: 0.28
    optim:
      lr: 1.0e-6
  rollout:
    n: 16
    temperature: 1.0
trainer:
  save_freq: 20
  logger: ['console']
async_training:
  staleness_threshold: 0.5
  trigger_parameter_sync_step: 4
  require_batches: 4
  partial_rollout: true
critic:
  optim:
    lr: 1.0e-5
"""


def write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_pasted_config_is_one_grouped_diagnostic_and_still_linted(tmp_path):
    result = load_config(write(tmp_path, VERL_FULLY_ASYNC))
    assert result.config is None and result.partial is not None
    (grouped,) = [d for d in result.diagnostics if d.code == "F008"]
    assert grouped.message.startswith("this looks like a verl fully-async config: ")
    assert "have no equivalent" in grouped.message and grouped.location.line == 2
    assert "`trainer.logger`" in grouped.help and "`critic.optim.lr`" in grouped.help
    assert "valid keys in" not in grouped.help
    assert [d.code for d in result.diagnostics] == ["F008"]
    # The rules ran on what loaded: the sync interval mapped exactly, and it says it was assumed.
    assert result.partial.async_.update_weights_interval == 4 and result.partial.rollout.n_samples_per_prompt == 16
    found = [d for d in lint(result) if d.code == "U001" and d.key == "async.update_weights_interval"]
    assert found and "[assumed: `async.update_weights_interval` 4 from verl's " in found[0].message
    assert CliRunner().invoke(app, ["check", str(result.provenance.top_file)]).exit_code == 1


def test_rules_run_past_unknown_keys_and_bad_values(tmp_path):
    path = write(tmp_path, "mode: fully_async\nasync:\n  max_weight_staleness: null\ntrain:\n  lr: fast\n"
                           "  global_batchsize: 64\n")
    codes = {d.code for d in lint(load_config(path))}
    assert {"F006", "F007", "S003"} <= codes


def test_a_few_habits_are_reported_key_by_key(tmp_path):
    result = load_config(write(tmp_path, "rollout_batch_size: 32\nactor_rollout_ref:\n  rollout:\n    n: 8\n"))
    assert sorted((d.code, d.key) for d in result.diagnostics) == [
        ("F008", "actor_rollout_ref.rollout.n"), ("F008", "rollout_batch_size")]
    assert result.partial.rollout.batch_size == 32 and result.partial.rollout.n_samples_per_prompt == 8


@pytest.mark.parametrize("key, framework, target", [
    # Missing before: the keys that set optimizer steps per drain, the seed of S001.
    ("async_training.require_batches", "verl", "train.num_steps_per_rollout"),
    ("actor.ppo_n_minibatches", "areal", "train.num_steps_per_rollout"),
    ("steps_per_generation", "trl", "train.num_steps_per_rollout"),
    ("async_training.use_rollout_log_probs", "verl", "correction.ratio_anchor"),
    ("async_training.compute_prox_log_prob", "verl", "correction.ratio_anchor"),
    ("algorithm.rollout_correction.rollout_is", "verl", "correction.level"),
    ("algorithm.rollout_correction.bypass_mode", "verl", "correction.ratio_anchor"),
    ("algorithm.adv_estimator", "verl", "train.advantage_estimator"),
    ("trainer.n_gpus_per_node", "verl", "resources.trainer_ranks"),
    ("--rollout-num-gpus", "slime", "resources.num_rollout_engines"),
    ("--actor-num-gpus-per-node", "slime", "resources.trainer_ranks"),
    ("trainer.save_freq", "verl", "checkpoint.every"),
    ("orchestrator.max_off_policy_steps", "prime-rl", "async.max_weight_staleness"),
    ("max_staleness", "trl", "async.max_weight_staleness"),
    ("--async_train", "openrlhf", "mode"),
    ("--partial_rollout_enable", "openrlhf", "async.partial_rollout"),
    # Wrong before.
    ("train.batch_size", "openrlhf", "train.global_batch_size"),
    ("--fully-async", "miles", "mode"),
])
def test_hints_name_the_fasync_key(key, framework, target):
    rows = mappings_for(key.split("."))
    assert any(row.framework == framework and target in row.targets for row in rows), rows


def test_hints_that_were_wrong(tmp_path):
    def diagnostic(text):
        (d,) = load_config(write(tmp_path, text)).diagnostics
        return d

    openrlhf = diagnostic("train:\n  batch_size: 128\n")
    assert openrlhf.code == "F008" and "`train.global_batch_size`" in openrlhf.message
    assert "not rollout.batch_size" in openrlhf.help
    trigger = diagnostic("async_training:\n  trigger_parameter_sync_step: 4\n")
    assert "fetches" in trigger.help and "not a count of mini-batches" in trigger.help
    assert "`mode`" in diagnostic("fully_async: true\n").message
    gpus = diagnostic("rollout_num_gpus: 4\n")
    assert "`resources.num_rollout_engines`" in gpus.message and "did you mean" not in gpus.help
    critic = diagnostic("critic:\n  ppo_epochs: 2\n")
    assert "no fasync equivalent" in critic.message and "no critic" in critic.help
    epochs = diagnostic("actor_rollout_ref:\n  actor:\n    ppo_epochs: 2\n")
    assert "`train.ppo_epochs`" in epochs.message


def test_hydra_overrides_name_their_keys(tmp_path):
    path = write(tmp_path, "train:\n  lr: 0.01\n")
    result = load_config(path, ["+actor_rollout_ref.rollout.n=8", "~train.lr"])
    (diagnostic,) = result.diagnostics
    assert diagnostic.key == "actor_rollout_ref.rollout.n" and "+" not in diagnostic.message
    assert result.partial.train.lr == 1e-3  # deleted by `~`, back to its default
    assert CliRunner().invoke(app, ["check", str(path), "~train.lr"]).exit_code == 0


def test_a_toml_file_is_told_fasync_is_yaml(tmp_path):
    path = write(tmp_path, "max_steps = 20\n\n[orchestrator]\nbatch_size = 128\n", name="rl.toml")
    (diagnostic,) = load_config(path).diagnostics
    assert "TOML" in diagnostic.help and "YAML" in diagnostic.help and "prime-rl" in diagnostic.help
    assert CliRunner().invoke(app, ["check", str(path)]).exit_code == 1


def test_every_framework_has_a_table_and_every_target_is_a_fasync_key():
    from fasync.config.fields import leaf_paths
    from fasync.config.provenance import format_key

    keys = {format_key(p) for p in leaf_paths()} | {"mode"}
    assert {row.framework for row in TABLE} == set(FRAMEWORKS)
    assert {t for row in TABLE for t in row.targets} <= keys
    assert all(row.note or row.kind == "same" for row in TABLE)
