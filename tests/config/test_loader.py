"""The loader: layering, provenance, interpolation and one located diagnostic per problem."""

from pathlib import Path

import pytest
from paths import LOADER_CONFIGS

from fasync.config.loader import load_config
from fasync.config.provenance import format_key, parse_key
from fasync.diagnostics import Location
from fasync.frameworks import TABLE


def fixture(name: str) -> str:
    return str(LOADER_CONFIGS / name)


def located(result) -> set[tuple[str, str, int, int]]:
    """(code, file name, line, column) of every diagnostic."""
    return {(d.code, Path(d.location.file).name, d.location.line, d.location.column) for d in result.diagnostics}


def test_extends_merges_bases_in_order_then_the_file():
    result = load_config(fixture("grandchild.yaml"))
    assert result.diagnostics == []
    cfg = result.config
    assert cfg.mode == "async"  # base.yaml
    assert cfg.rollout.batch_size == 8  # child.yaml over base.yaml
    assert cfg.rollout.n_samples_per_prompt == 4  # base.yaml, kept by the key-by-key merge
    assert cfg.train.micro_batch_size == 16  # nested/gpu.yaml, listed after base.yaml
    assert cfg.train.global_batch_size == 64
    assert cfg.train.lr == 0.01  # grandchild.yaml
    assert cfg.resources.trainer_ranks == 2
    assert cfg.lint.ignore == ["X300"]  # lists are replaced, not concatenated
    assert "extends" not in result.raw


def test_provenance_points_at_the_layer_that_set_each_value():
    result = load_config(fixture("grandchild.yaml"))
    origin = result.provenance.origin
    assert origin("mode") == Location(fixture("base.yaml"), 1, 1)
    assert origin("rollout.batch_size") == Location(fixture("child.yaml"), 3, 3)
    assert origin("rollout.n_samples_per_prompt") == Location(fixture("base.yaml"), 4, 3)
    assert origin("train.micro_batch_size") == Location(fixture("nested/gpu.yaml"), 4, 3)
    assert origin("train.lr") == Location(fixture("grandchild.yaml"), 3, 3)
    assert origin("lint.ignore") == Location(fixture("child.yaml"), 5, 3)
    # The replaced list forgets the base's items: item 1 only existed in base.yaml.
    assert origin("lint.ignore[0]") == Location(fixture("child.yaml"), 5, 12)
    assert origin("lint.ignore[1]") == Location(fixture("child.yaml"), 5, 3)


def test_a_default_points_at_the_nearest_parent_or_the_top_file():
    result = load_config(fixture("grandchild.yaml"))
    assert result.provenance.setter("train.kl_coef") is None
    # `train` was last named by grandchild.yaml.
    assert result.provenance.origin("train.kl_coef") == Location(fixture("grandchild.yaml"), 2, 1)
    assert result.provenance.origin("correction.level") == Location(fixture("grandchild.yaml"), 1, 1)


def test_overrides_are_yaml_typed_applied_last_and_located_at_cli():
    result = load_config(fixture("grandchild.yaml"), ["train.lr=3e-4", "rollout.temperature=0.5",
                                                      "train.target_reward=null", "lint.ignore=[A1]"])
    assert result.diagnostics == []
    cfg = result.config
    assert cfg.train.lr == pytest.approx(3e-4) and cfg.rollout.temperature == 0.5
    assert cfg.train.target_reward is None and cfg.lint.ignore == ["A1"]
    assert result.provenance.origin("train.lr") == Location("<cli>", 1, 1)
    assert result.provenance.origin("lint.ignore[0]") == Location("<cli>", 4, 1)
    assert result.provenance.origin("train.micro_batch_size") == Location(fixture("nested/gpu.yaml"), 4, 3)


def test_interpolation_and_environment_variables(monkeypatch):
    monkeypatch.setenv("FASYNC_TEST_RUN", "nightly")
    monkeypatch.delenv("FASYNC_TEST_SEED", raising=False)
    result = load_config(fixture("interpolation.yaml"))
    assert result.diagnostics == []
    assert result.config.train.global_batch_size == 16
    assert result.config.train.seed == 7
    assert result.config.logging.run_dir == "runs/sync-nightly"  # `mode` is a default: interpolation sees it
    assert result.raw["logging"]["run_dir"] == "runs/sync-nightly"
    assert "mode" not in result.raw


def test_interpolation_sees_overrides_and_other_layers(monkeypatch):
    monkeypatch.setenv("FASYNC_TEST_SEED", "11")
    result = load_config(fixture("interpolation.yaml"), ["rollout.batch_size=64", "mode=async"])
    assert result.config.train.global_batch_size == 64
    assert result.config.train.seed == 11
    assert result.config.logging.run_dir == "runs/async-default"
    assert result.raw["train"]["global_batch_size"] == 64


@pytest.mark.parametrize("name, expected", [
    ("missing.yaml", {("F001", "missing.yaml", 1, 1)}),
    ("missing_base.yaml", {("F001", "missing_base.yaml", 4, 5)}),
    ("syntax.yaml", {("F002", "syntax.yaml", 4, 8)}),
    ("duplicate.yaml", {("F003", "duplicate.yaml", 4, 3)}),
    ("cycle_a.yaml", {("F004", "cycle_b.yaml", 3, 5)}),
    ("bad_interpolation.yaml", {("F005", "bad_interpolation.yaml", 3, 3)}),
    ("unknown.yaml", {("F006", "unknown.yaml", 2, 3), ("F006", "unknown.yaml", 4, 1),
                      ("F006", "unknown.yaml", 6, 1)}),
    ("wrong_types.yaml", {("F007", "wrong_types.yaml", 1, 1), ("F007", "wrong_types.yaml", 3, 3),
                          ("F007", "wrong_types.yaml", 4, 3), ("F007", "wrong_types.yaml", 6, 3)}),
    ("not_a_mapping.yaml", {("F009", "not_a_mapping.yaml", 1, 1)}),
    ("bad_extends.yaml", {("F010", "bad_extends.yaml", 1, 1)}),
])
def test_each_load_problem_is_one_located_diagnostic_and_no_config(name, expected):
    result = load_config(fixture(name))
    assert located(result) == expected
    assert result.config is None
    assert all(d.help for d in result.diagnostics)


def test_syntax_error_names_where_the_open_construct_started():
    (diagnostic,) = load_config(fixture("syntax.yaml")).diagnostics
    assert "flow sequence (line 3, column 22)" in diagnostic.message


def test_duplicate_key_names_the_first_line():
    (diagnostic,) = load_config(fixture("duplicate.yaml")).diagnostics
    assert diagnostic.key == "train.lr" and "line 2" in diagnostic.message


def test_extends_cycle_names_the_loop():
    (diagnostic,) = load_config(fixture("cycle_a.yaml")).diagnostics
    assert "cycle_a.yaml → " in diagnostic.message and diagnostic.message.endswith("cycle_a.yaml")


def test_a_bad_interpolation_falls_back_to_the_default_instead_of_a_second_error():
    result = load_config(fixture("bad_interpolation.yaml"))
    assert [d.code for d in result.diagnostics] == ["F005"]
    assert "global_batch_size" not in result.raw["train"]


def test_unknown_keys_get_did_you_mean():
    helps = {d.key: d.help for d in load_config(fixture("unknown.yaml")).diagnostics}
    assert helps["train.global_batchsize"] == "did you mean `train.global_batch_size`?"
    assert helps["rolout"] == "did you mean `rollout`?"
    assert helps["lr"] == "did you mean `train.lr`?"


def test_wrong_types_say_what_was_expected_and_got():
    messages = {d.key: d.message for d in load_config(fixture("wrong_types.yaml")).diagnostics}
    assert "'eight'" in messages["rollout.n_samples_per_prompt"]
    assert "less than or equal to 1" in messages["rollout.top_p"]
    assert "greater than 0" in messages["train.lr"]
    assert "'turbo'" in messages["mode"]


def test_bad_overrides_are_located_at_their_position():
    result = load_config(fixture("base.yaml"), ["train.lr=1e-3", "train..lr=1", "rollout.top_p=[0.9",
                                                "rollout.batch_size=many"])
    assert {(d.code, d.location) for d in result.diagnostics} == {
        ("F011", Location("<cli>", 2, 1)), ("F011", Location("<cli>", 3, 1)), ("F007", Location("<cli>", 4, 1))}


FOREIGN = {
    "actor_rollout_ref.actor.ppo_mini_batch_size": (4, "train.global_batch_size"),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": (5, "train.micro_batch_size"),
    "actor_rollout_ref.rollout.n": (7, "rollout.n_samples_per_prompt"),
    "async_training.staleness_threshold": (9, "async.max_weight_staleness"),
    "async_training.trigger_parameter_sync_step": (10, "async.update_weights_interval"),
    "rollout.max_head_offpolicyness": (12, "async.max_weight_staleness"),
    "rollout.num_generations": (13, "rollout.n_samples_per_prompt"),
    "rollout.max_response_length": (14, "rollout.max_new_tokens"),
    "train.learning_rate": (17, "train.lr"),
    "train.kl_loss_coef": (18, "train.kl_coef"),
    "train.clip_ratio_low": (19, "train.clip_eps_low"),
    "train.clip_ratio_high": (20, "train.clip_eps_high"),
    "rollout_batch_size": (23, "rollout.batch_size"),
    "n_samples": (24, "rollout.n_samples_per_prompt"),
    "train_batch_size": (25, "train.global_batch_size"),
    "use_tis": (26, "correction.level"),
    "eps_clip": (27, "train.clip_eps_high"),
}


def test_foreign_keys_name_the_fasync_key_where_they_were_written():
    result = load_config(fixture("foreign.yaml"))
    by_key = {d.key: d for d in result.diagnostics if d.code == "F008"}
    assert set(by_key) == set(FOREIGN)
    # fasync's own keys in the wrong section are F006, with fasync's name for them.
    misplaced = {d.key: d.help for d in result.diagnostics if d.code == "F006"}
    assert misplaced == {"rollout.partial_rollout": "did you mean `async.partial_rollout`?",
                         "train.n_samples_per_prompt": "did you mean `rollout.n_samples_per_prompt`?",
                         "train.over_sampling_batch_size": "did you mean `rollout.over_sampling_batch_size`?"}
    for key, (line, target) in FOREIGN.items():
        assert by_key[key].location.line == line, key
        if target is not None:
            assert f"`{target}`" in by_key[key].message, key


def test_foreign_key_hints_state_differences_in_meaning():
    by_key = {d.key: d for d in load_config(fixture("foreign.yaml")).diagnostics}
    assert "× rollout.n_samples_per_prompt" in by_key["actor_rollout_ref.actor.ppo_mini_batch_size"].help
    assert "fraction" in by_key["async_training.staleness_threshold"].help
    assert "versions" in by_key["rollout.max_head_offpolicyness"].help
    assert "rollout.batch_size" in by_key["train_batch_size"].message  # verl's meaning
    assert len({m.targets for m in TABLE}) >= 15


def test_cli_style_foreign_flags_match_too(tmp_path):
    path = tmp_path / "slime.yaml"
    path.write_text("--rollout-batch-size: 32\n")
    (diagnostic,) = load_config(path).diagnostics
    assert diagnostic.code == "F008" and "`rollout.batch_size`" in diagnostic.message


def test_yaml_anchors_merge_keys_and_odd_scalars(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("shared: &shared {temperature: 0.7, top_p: 0.9}\n"
                    "rollout:\n  <<: *shared\n  top_p: 0.95\n")
    result = load_config(path)
    assert [d.key for d in result.diagnostics] == ["shared"]
    assert result.raw["rollout"] == {"top_p": 0.95, "temperature": 0.7}
    assert result.provenance.origin("rollout.temperature").line == 1
    assert result.provenance.origin("rollout.top_p").line == 4


def test_empty_file_is_the_default_config(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing but a comment\n")
    result = load_config(path)
    assert result.diagnostics == [] and result.config.mode == "sync"


def test_key_paths_round_trip():
    assert parse_key("correction.reject_token_ratio[1]") == ("correction", "reject_token_ratio", 1)
    assert parse_key("a.0.b") == ("a", 0, "b")
    assert format_key(("correction", "reject_token_ratio", 1)) == "correction.reject_token_ratio[1]"


def test_a_misspelt_section_is_one_diagnostic_not_one_per_key(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("asynch:\n  max_weight_staleness: 2\n  partial_rollout: true\n")
    (diagnostic,) = load_config(path).diagnostics
    assert (diagnostic.code, diagnostic.key, diagnostic.help) == ("F006", "asynch", "did you mean `async`?")


@pytest.mark.parametrize("override, key, shown", [
    ("train.lr=.inf", "train.lr", "inf"),
    ("train.target_reward=.nan", "train.target_reward", "nan"),
    ("train.entropy_coef=.inf", "train.entropy_coef", "inf"),
    ("train.entropy_coef=-.inf", "train.entropy_coef", "-inf"),
    ("correction.weight_upper=.inf", "correction.weight_upper", "inf"),
    ("correction.reject_token_ratio=[0.5, .nan]", "correction.reject_token_ratio[1]", "nan"),
])
def test_non_finite_numbers_are_located_errors(override, key, shown):
    # `.inf` and `.nan` are YAML floats that passed every range check (`gt=0`, none at all) before.
    result = load_config(fixture("grandchild.yaml"), [override])
    assert result.config is None
    [diagnostic] = result.diagnostics
    assert (diagnostic.code, diagnostic.key, diagnostic.location) == ("F007", key, Location("<cli>", 1, 1))
    assert f"`{key}`: Input should be a finite number (got {shown})" in diagnostic.message


def test_a_non_finite_number_in_a_file_is_located_at_its_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  lr: 1.0e-3\n  target_reward: .NaN\n")
    [diagnostic] = load_config(str(path)).diagnostics
    assert (diagnostic.code, diagnostic.location) == ("F007", Location(str(path), 3, 3))
