"""`fasync import` on sources it cannot use, and foreign text it must not let through (issue 32 §5 #6, #10, #12,
#24): each ends with exit 1 and one line naming the file and what is wrong, never a traceback, and nothing
foreign becomes a live fasync key."""

import re

import pytest
import yaml
from typer.testing import CliRunner

from fasync.cli import app
from fasync.config.loader import load_config

VERL_RUN = ("python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_batch_size=8 "
            "actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2\n")


def _import(*arguments: str):
    result = CliRunner().invoke(app, ["import", *arguments])
    assert "Traceback" not in result.output and not (
        result.exception and not isinstance(result.exception, SystemExit)), result.output
    return result


def _one_line_failure(result, *fragments: str) -> None:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("fasync import: ") and all(f in lines[0] for f in fragments), lines[0]


def test_a_foreign_key_holding_yaml_cannot_inject_a_fasync_key(tmp_path):
    source = tmp_path / "evil.json"
    source.write_text('{"algorithm": {"adv_estimator": "grpo"}, "data": {"train_batch_size": 8}, '
                      '"actor_rollout_ref": {"rollout": {"n": 4}, "actor": {"ppo_mini_batch_size": 2}}, '
                      '"x\\nreward:\\n  function: evilmod:score\\n#": "\\nmode: sync\\n"}')
    out = tmp_path / "fasync.yaml"
    _import("verl", str(source), "-o", str(out))
    text = out.read_text()
    data = yaml.safe_load(text)
    assert "reward" not in data and all(not line.startswith("reward") for line in text.splitlines())
    assert "evilmod" in text  # still listed, escaped, under "No fasync equivalent"
    assert load_config(out).config.reward.function == "exact_match"


@pytest.mark.parametrize(("framework", "name", "content", "fragment"), [
    ("verl", "run.yaml", "data:\n  train_batch_size: [1, 2\n", "not valid YAML"),
    ("verl", "run.json", '{"data": {"train_batch_size": 8', "not valid JSON"),
    ("prime-rl", "rl.toml", "max_steps = 20\n[orchestrator\n", "not valid TOML"),
    ("trl", "train.py", "from trl import GRPOConfig\nargs = GRPOConfig(num_generations=8,\n", "not valid Python"),
    ("miles", "run.py", "ARGS = (\n  '--rollout-batch-size 8 '\n", "not valid Python"),
    ("areal", "grpo.yaml", "x: !!python/object:os.system {}\n", "python/object"),
    ("slime", "run.sh", b"\x7fELF\x02\x01\x01\x00\x00\x00", "a binary file"),
    ("openrlhf", "run.sh", b"python3 -m openrlhf.cli.train_ppo_ray --rollout_batch_size \xff\xfe\n", "not UTF-8"),
])
def test_an_unreadable_source_fails_with_one_line(tmp_path, framework, name, content, fragment):
    source = tmp_path / name
    source.write_bytes(content if isinstance(content, bytes) else content.encode())
    _one_line_failure(_import(framework, str(source)), name, fragment)


def test_a_missing_source_or_a_directory_fails(tmp_path):
    _one_line_failure(_import("verl", str(tmp_path / "nonexistent.yaml")), "nonexistent.yaml", "no such file")
    _one_line_failure(_import("verl", str(tmp_path)), "a directory")


def test_out_onto_a_directory_a_missing_folder_a_full_disk_or_its_own_source(tmp_path):
    source = tmp_path / "run.sh"
    source.write_text(VERL_RUN)
    _one_line_failure(_import("verl", str(source), "-o", str(tmp_path)), "a directory")
    _one_line_failure(_import("verl", str(source), "-o", str(tmp_path / "no" / "x.yaml")), "does not exist")
    _one_line_failure(_import("verl", str(source), "-o", "/dev/full"), "cannot be written")
    _one_line_failure(_import("verl", str(source), "-o", str(source)), "that is SOURCE")
    assert source.read_text() == VERL_RUN


def test_a_source_with_nothing_the_framework_names_fails(tmp_path):
    source = tmp_path / "run.sh"
    source.write_text("echo hello\npython3 tools/convert.py --input a --output b\n")
    _one_line_failure(_import("slime", str(source)), "no slime setting found", "looked for")


def test_a_variable_the_script_does_not_set_is_named_with_the_flag(tmp_path):
    source = tmp_path / "run.sh"
    source.write_text("python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_batch_size=$BATCH "
                      "actor_rollout_ref.rollout.n=${N:-4} actor_rollout_ref.actor.ppo_mini_batch_size=2\n")
    out = tmp_path / "fasync.yaml"
    _import("verl", str(source), "-o", str(out))
    assert "--env BATCH=VALUE" in out.read_text()
    assert load_config(out).config.rollout.n_samples_per_prompt == 4
    _import("verl", str(source), "-o", str(out), "--env", "BATCH=16")
    assert load_config(out).config.rollout.batch_size == 16


def test_an_import_without_data_or_reward_says_what_to_set_and_exits_1(tmp_path):
    source = tmp_path / "run.sh"
    source.write_text(VERL_RUN.replace("main_ppo", "main_ppo data.train_files=/data/gsm8k.jsonl"))
    out = tmp_path / "fasync.yaml"
    result = _import("verl", str(source), "-o", str(out))
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 1 and "All checks passed" not in result.output
    assert last.startswith("fasync import: set reward.function") and "custom_reward_function.path" in last
    assert load_config(out).config.data.path == "/data/gsm8k.jsonl"
    source.write_text(VERL_RUN)
    last = _import("verl", str(source), "-o", str(out)).output.strip().splitlines()[-1]
    assert "set data.path (looked for data.train_files)" in last and "built-in reverse task" in last


def test_without_out_the_diagnostics_point_at_the_printed_config(tmp_path):
    source = tmp_path / "run.sh"
    source.write_text(VERL_RUN.replace("ppo_mini_batch_size=2", "ppo_mini_batch_size=3"))  # 32 samples, steps of 12
    result = _import("verl", str(source))
    assert "(the config above):" in result.output
    assert not re.search(r"^\S+\.yaml:\d+:\d+:", result.output, re.M)  # no deleted temporary file named


def test_checking_a_toml_file_does_not_echo_it_whole(tmp_path):
    """F009 on a framework's TOML that YAML reads as one long scalar (issue 30 §9) names its size and its
    beginning, not its whole text."""
    source = tmp_path / "orch.toml"
    source.write_text("max_steps = 500\nbatch_size = 1024\nseq_len = 8192\nrollouts_per_example = 8\n"
                      "max_async_level = 2\n")
    result = CliRunner().invoke(app, ["check", str(source)])
    message = next(line for line in result.output.splitlines() if "F009" in line)
    assert "a scalar of 93 characters ('max_steps = 500" in message and "max_async_level" not in message


def test_a_device_a_huge_file_and_an_alias_bomb_are_refused(tmp_path):
    _one_line_failure(_import("verl", "/dev/zero"), "not a regular file")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (11 * 1024 * 1024))
    _one_line_failure(_import("verl", str(big)), "larger than any config")
    bomb = tmp_path / "bomb.yaml"
    levels = ["a0: &a0 {x: 1, y: 1, z: 1, w: 1, v: 1, u: 1, t: 1, s: 1, r: 1, q: 1}"]
    levels += [f"a{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(10)) + "}" for i in range(1, 9)]
    bomb.write_text("\n".join(levels) + "\n")
    _one_line_failure(_import("verl", str(bomb)), "aliases")
