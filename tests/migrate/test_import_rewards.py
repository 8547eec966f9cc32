"""`fasync import` carries each framework's reward and rollout functions (issue 30 §7, issue 27 §6): what fasync
calls as it is becomes `reward.function` / `reward.url`; a function of the framework's own signature is asked for
with one line saying how to adapt it; an import with data and a reward exits as `fasync check` does."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from fasync.cli import app
from fasync.config.loader import load_config

VERL = ("python -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_batch_size=8 "
        "actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2 "
        "actor_rollout_ref.rollout.name=hf data.train_files=/data/gsm8k/train.parquet {}\n")
SLIME = ("python3 train.py --rollout-batch-size 8 --n-samples-per-prompt 4 --global-batch-size 32 "
         "--prompt-data /data/math.jsonl --hf-checkpoint /models/qwen --actor-num-gpus-per-node 4 "
         "--rollout-num-gpus 4 {}\n")
OPENRLHF = ("python3 -m openrlhf.cli.train_ppo_ray --advantage_estimator group_norm --rollout_batch_size 8 "
            "--n_samples_per_prompt 4 --train_batch_size 32 --prompt_data /data/math.jsonl --pretrain /models/qwen "
            "--vllm_num_engines 1 {}\n")


def _import(tmp_path: Path, framework: str, script: str):
    source = tmp_path / "run.sh"
    source.write_text(script)
    out = tmp_path / "fasync.yaml"
    result = CliRunner().invoke(app, ["import", framework, str(source), "-o", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result, out


def _last(result) -> str:
    return result.output.strip().splitlines()[-1]


def test_verls_custom_reward_function_is_a_module_beside_the_config(tmp_path):
    script = VERL.format("custom_reward_function.path=/work/rewards/my_reward.py custom_reward_function.name=score")
    result, out = _import(tmp_path, "verl", script)
    assert load_config(out).config.reward.function == "my_reward:score"
    assert "put my_reward.py beside this config" in out.read_text()
    assert result.exit_code == 1 and "E010" in result.output  # not beside the config yet: check says so
    (tmp_path / "my_reward.py").write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                           "    return 1.0\n")
    result, _ = _import(tmp_path, "verl", script)
    assert result.exit_code == 0 and "E010" not in result.output, result.output


def test_verls_default_reward_is_asked_for_with_what_verl_would_do(tmp_path):
    result, out = _import(tmp_path, "verl", VERL.format(""))
    assert result.exit_code == 1 and _last(result).startswith("fasync import: set reward.function (verl scores with")
    assert "math_verify" in _last(result) and load_config(out).config.data.path == "/data/gsm8k/train.parquet"


def test_verls_learned_reward_model_is_not_supported(tmp_path):
    result, _ = _import(tmp_path, "verl", VERL.format("reward_model.enable=True"))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "not supported: a learned reward model" in lines[0]


def test_verls_multi_turn_tool_loop_asks_for_an_environment_and_keeps_its_turns(tmp_path):
    script = VERL.format("actor_rollout_ref.rollout.multi_turn.enable=True "
                         "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5 "
                         "actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml "
                         "custom_reward_function.path=my_reward.py")
    result, out = _import(tmp_path, "verl", script)
    config = load_config(out).config
    assert config.rollout.max_turns == 5 and config.rollout.tool_parser == "hermes"
    last = _last(result)
    assert result.exit_code == 1 and last.startswith("fasync import: set rollout.env (")
    assert "tool_config_path" in last and "BaseTool" in last and "one completion per prompt" in last


def test_slimes_rule_based_rewards_are_fasyncs_built_ins_and_the_import_exits_as_check(tmp_path):
    for rm_type, builtin in (("math", "boxed_math"), ("deepscaler", "math_verify"), ("boxed_dapo", "math_verify")):
        result, out = _import(tmp_path, "slime", SLIME.format(f"--rm-type {rm_type}"))
        assert load_config(out).config.reward.function == builtin
        assert result.exit_code == 0 and "All checks passed!" in result.output, result.output
    result, _ = _import(tmp_path, "slime", SLIME.format("--rm-type f1"))
    assert result.exit_code == 1 and "no fasync built-in scores like it" in _last(result)


def test_a_remote_reward_server_is_reward_url(tmp_path):
    result, out = _import(tmp_path, "slime", SLIME.format("--rm-type remote_rm --rm-url http://rm:8000/score"))
    assert load_config(out).config.reward.url == "http://rm:8000/score" and result.exit_code == 0, result.output
    assert "not slime's one sample a request" in out.read_text()
    result, out = _import(tmp_path, "openrlhf", OPENRLHF.format("--remote_rm_url http://rm:5000/get_reward"))
    assert load_config(out).config.reward.url == "http://rm:5000/get_reward" and result.exit_code == 0, result.output
    result, _ = _import(tmp_path, "openrlhf", OPENRLHF.format("--remote_rm_url http://a:5000/r,http://b:5000/r"))
    assert _last(result).startswith("fasync import: set reward.url (") and "2 servers" in _last(result)


def test_functions_of_the_frameworks_own_signature_are_asked_for_saying_how_to_adapt_them(tmp_path):
    result, out = _import(tmp_path, "slime", SLIME.format(
        "--custom-rm-path retool.reward_func --custom-generate-function-path retool.generate --rm-type math"))
    last = _last(result)
    assert result.exit_code == 1 and "reward_func(args, sample" in last and "async def f(task, engine)" in last
    assert load_config(out).config.reward.function == "exact_match"  # never slime's function, called wrongly
    result, _ = _import(tmp_path, "openrlhf", OPENRLHF.format("--remote_rm_url /work/reward_func.py"))
    assert "reward_func:reward_func" in _last(result) and "reward.batched: true" in _last(result)
    result, _ = _import(tmp_path, "openrlhf", OPENRLHF.format("--agent_func_path /work/agent_func.py"))
    assert _last(result).startswith("fasync import: set rollout.env (") and "reward.function" not in _last(result)


def test_check_names_a_pasted_configs_functions_to_adapt(tmp_path):
    config = tmp_path / "slime.yaml"
    config.write_text("rollout_max_response_len: 1024\nnum_rollout: 100\nrollout_num_gpus_per_engine: 1\n"
                      "rollout_temperature: 0.8\nclip_grad: 1.0\ntis_clip: 2.0\ncustom_rm_path: retool.reward_func\n")
    foreign = [d for d in load_config(config).diagnostics if d.code == "F008"]
    assert len(foreign) == 1 and foreign[0].message.endswith("1 name a function to adapt")
    assert "to adapt (docs/migrate.md): `custom_rm_path` → `reward.function`" in foreign[0].help


def test_openrlhfs_learned_reward_model_imports_whole_and_asks_for_the_server_that_runs_it(tmp_path):
    result, out = _import(tmp_path, "openrlhf", OPENRLHF.format("--reward_pretrain /models/rm"))
    assert result.exit_code == 1 and _last(result).startswith("fasync import: set reward.url (")
    assert 'reward_pretrain "/models/rm": a learned reward model' in _last(result)
    config = load_config(out).config
    assert config.rollout.n_samples_per_prompt == 4 and config.reward.url is None
    # OpenRLHF builds no reward model when a remote one is given: the server is the reward.
    result, out = _import(tmp_path, "openrlhf", OPENRLHF.format(
        "--reward_pretrain /models/rm --remote_rm_url http://rm:5000/get_reward"))
    assert load_config(out).config.reward.url == "http://rm:5000/get_reward" and result.exit_code == 0, result.output


def test_openrlhfs_learned_reward_model_beside_a_critic_is_not_supported(tmp_path):
    result, _ = _import(tmp_path, "openrlhf", OPENRLHF.format("--reward_pretrain /models/rm").replace(
        "--advantage_estimator group_norm", "--advantage_estimator gae"))
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1
    assert "not supported: PPO with a critic" in lines[0] and "a learned reward model" in lines[0]


def test_trls_reward_model_id_is_not_supported(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("from trl import GRPOConfig, GRPOTrainer\n"
                      "args = GRPOConfig(output_dir='out', num_generations=4, per_device_train_batch_size=8)\n"
                      "trainer = GRPOTrainer(model='/models/qwen', args=args, reward_funcs=['org/reward-model'])\n")
    result = CliRunner().invoke(app, ["import", "trl", str(script)])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "a learned reward model (reward_funcs org/reward-model)" in lines[0]
