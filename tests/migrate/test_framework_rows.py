"""Every key-table row that says `converted` is converted by its framework's importer: given the key (with a value
the framework documents), `fasync import` writes one of the row's fasync keys from it and does not list it as
"converted by hand". An `adapt it` row asks for its fasync key with the row's note. (docs/migrate.md is generated
from these tables, so a row that lies there lies to users.)"""

from __future__ import annotations

import pytest

from fasync.frameworks import FRAMEWORKS
from fasync.frameworks.common import ADAPT, CONVERTED, Source
from fasync.migrate import translate

BASE = {
    "verl": {"algorithm.adv_estimator": "grpo", "actor_rollout_ref.rollout.n": 4,
             "actor_rollout_ref.actor.ppo_mini_batch_size": 8, "data.train_batch_size": 16,
             "actor_rollout_ref.model.path": "/models/qwen"},
    "slime": {"rollout_batch_size": 16, "n_samples_per_prompt": 4, "global_batch_size": 32,
              "hf_checkpoint": "/models/qwen"},
    "areal": {"train_dataset.batch_size": 16, "gconfig.n_samples": 4, "actor.path": "/models/qwen"},
    "prime-rl": {"orchestrator.group_size": 4, "model.name": "/models/qwen"},
    "openrlhf": {"advantage_estimator": "group_norm", "rollout_batch_size": 16, "n_samples_per_prompt": 4,
                 "train_batch_size": 32, "pretrain": "/models/qwen"},
    "trl": {"num_generations": 4, "per_device_train_batch_size": 8, "model": "/models/qwen"},
}
"""Settings each framework's importer needs to run at all (an estimator it supports, a geometry, a model for
vLLM)."""
BASE["miles"] = BASE["slime"]

EXAMPLES = {
    "data.train_files": "/data/gsm8k/train.parquet", "actor_rollout_ref.actor.ppo_mini_batch_size": 8, "data.filter_overlong_prompts": True,
    "custom_reward_function.path": "/work/my_reward.py", "custom_reward_function.name": "compute_score",
    "actor_rollout_ref.rollout.name": "vllm", "actor_rollout_ref.actor.ppo_micro_batch_size": 8,
    "actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_coef": 0.01,
    "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-mean", "algorithm.adv_estimator": "grpo",
    "actor_rollout_ref.actor.use_rollout_log_probs": True, "algorithm.rollout_correction.rollout_is": "token",
    "algorithm.rollout_correction.rollout_rs": "seq_mean_k1", "algorithm.rollout_correction.rollout_rs_threshold":
    "0.99_1.001", "algorithm.rollout_correction.bypass_mode": True, "trainer.n_gpus_per_node": 4, "trainer.nnodes": 2,
    "trainer.save_freq": 10, "trainer.logger": ["console", "wandb"], "async_training.staleness_threshold": 0.5,
    "async_training.require_batches": 2, "async_training.use_rollout_log_probs": True,
    "async_training.compute_prox_log_prob": True, "rollout.n_gpus_per_node": 4, "rollout.nnodes": 1,
    "rollout.total_rollout_steps": 1600, "actor_rollout_ref.rollout.multi_turn.format": "hermes",
    "use_kl_loss": True, "kl_loss_coef": 0.01, "advantage_estimator": "grpo", "use_tis": True, "rollout_num_gpus": 4,
    "actor_num_gpus_per_node": 4, "actor_num_nodes": 1, "save_interval": 10, "use_wandb": True, "rm_type": "math",
    "rm_url": "http://localhost:8000/reward", "rollout_function_path": "fully_async_rollout.generate_rollout_fully_async",
    "fully_async": True, "async_data_buffer_capacity_factor": 2, "async_unused_samples_handler": "drop",
    "actor.reward_norm.std_level": None, "actor.recompute_logprob": True, "actor.use_decoupled_loss": True,
    "actor.rejection_sampling.upper": 5.0, "rollout.max_concurrent_rollouts": 32, "cluster.n_gpus_per_node": 8,
    "cluster.n_nodes": 1, "allocation_mode": "sglang:d4p1t1+fsdp:d4", "saver.freq_steps": 10,
    "stats_logger.wandb.mode": "online", "stats_logger.tensorboard.path": "/tmp/tb", "orchestrator.batch_size": 64,
    "deployment.num_train_gpus": 2, "deployment.num_infer_gpus": 2, "ckpt.*": {},
    "train.async_enable": True, "async_train": True, "train.async_queue_size": 2, "train.partial_rollout_enable": True,
    "partial_rollout_enable": True, "actor.eps_clip_low_high": [0.2, 0.28], "algo.advantage.estimator": "group_norm",
    "ckpt.save_steps": 10, "save_steps": 10, "use_tensorboard": "/tmp/tb", "actor.num_gpus_per_node": 4,
    "actor.num_nodes": 1, "algo.advantage.is_correction_enable": True, "algo.advantage.is_correction_threshold":
    [0.5, 5.0], "dynamic_filtering": True, "eps_clip_low_high": [0.2, 0.28],
    "remote_rm_url": "http://localhost:5000/get_reward", "reward.remote_url": "http://localhost:5000/get_reward",
    "gradient_accumulation_steps": 2, "steps_per_generation": 4, "generation_batch_size": 64, "loss_type": "dapo",
    "scale_rewards": "none", "vllm_importance_sampling_correction": True, "max_steps": 100, "report_to": "wandb",
    "use_vllm": True, "weight_sync_steps": 2, "queue_maxsize": 256, "max_tool_calling_iterations": 3,
    "reward_funcs": ["accuracy_reward"],
}
EXAMPLES |= {
    "actor_rollout_ref.model.lora_rank": 16, "actor_rollout_ref.model.lora_alpha": 32,
    "actor_rollout_ref.model.target_modules": "all-linear", "actor_rollout_ref.actor.policy_loss.loss_mode": "gspo",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": 10, "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.1,
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine", "actor_rollout_ref.actor.optim.warmup_style": "cosine",
    "actor_rollout_ref.rollout.top_k": 20, "reward_model.overlong_buffer.enable": True,
    "reward_model.overlong_buffer.len": 512, "reward_model.overlong_buffer.penalty_factor": 1.0,
    "lr_decay_style": "cosine", "model.name": "/models/qwen", "lora_rank": 16, "lora_alpha": 32,
    "target_modules": "all-linear", "importance_sampling_level": "token", "top_k": 20, "warmup_ratio": 0.1,
    "lr_scheduler_type": "cosine", "rollout.backend": "sglang:d4p1t1", "actor.backend": "fsdp:d4p1t1",
    "actor.reward_norm.mean_leave1out": True,
}
"""A value each converted key documents, by the key as the tables spell it (the second part: the algorithm rows)."""

COMPANIONS = {
    "actor_rollout_ref.actor.kl_loss_coef": {"actor_rollout_ref.actor.use_kl_loss": True},
    "algorithm.rollout_correction.rollout_rs": {"algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0"},
    "algorithm.rollout_correction.rollout_rs_threshold": {"algorithm.rollout_correction.rollout_rs": "token_k1"},
    "rollout.total_rollout_steps": {"async_training.require_batches": 1},
    "kl_loss_coef": {"use_kl_loss": True},
    "async_unused_samples_handler": {"fully_async": True},
    "async_data_buffer_capacity_factor": {"fully_async": True},
    "algo.advantage.is_correction_threshold": {"algo.advantage.is_correction_enable": True},
    "cluster.n_nodes": {"cluster.n_gpus_per_node": 8},
    "deployment.num_infer_gpus": {"deployment.num_train_gpus": 2},
    "train.async_queue_size": {"train.async_enable": True},
    "weight_sync_steps": {"max_staleness": 4},
    "queue_maxsize": {"max_staleness": 4},
    "actor_rollout_ref.model.lora_alpha": {"actor_rollout_ref.model.lora_rank": 16},
    "actor_rollout_ref.model.target_modules": {"actor_rollout_ref.model.lora_rank": 16},
    "lora_alpha": {"lora_rank": 16},
    "target_modules": {"lora_rank": 16},
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": {"trainer.total_training_steps": 100},
    "reward_model.overlong_buffer.len": {"reward_model.overlong_buffer.enable": True},
    "reward_model.overlong_buffer.penalty_factor": {"reward_model.overlong_buffer.enable": True,
                                                    "reward_model.overlong_buffer.len": 512},
    "warmup_ratio": {"max_steps": 100},
}
"""The settings a key counts only with, as in the framework (a KL coefficient only with the KL loss, a queue size
only in async training, LoRA's alpha only with a rank, a warmup ratio only with a run length)."""

ADAPTED = {
    "actor_rollout_ref.rollout.multi_turn.enable": True,
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": "config/tool_config/gsm8k_tool_config.yaml",
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path": "config/interaction_config/gsm8k.yaml",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path": "config/agent.yaml",
    "custom_generate_function_path": "generate_with_retool.generate",
    "custom_rm_path": "generate_with_retool.reward_func",
    "agent_func_path": "examples/python/agent_func.py",
    "reward_pretrain": "OpenRLHF/Llama-3-8b-rm-700k",
    "environment_factory": "WordleEnv",
}
"""A value each `adapt it` key documents."""


SPELLED = {("openrlhf", "advantage_estimator"): "group_norm"}
"""Where a framework spells a value its own way."""


def _rows(kind: str):
    return [(framework.id, row) for framework in FRAMEWORKS.values() for row in framework.keys if row.kind == kind]


def _translated(framework: str, key: str, value):
    source = Source(FRAMEWORKS[framework])
    for name, setting in {**BASE[framework], **COMPANIONS.get(key, {}), key: value}.items():
        source.values[name] = setting
    if key == "ckpt.*":  # a section row: the section's presence is the setting
        source.values = {**BASE[framework], "ckpt": {}}
    return translate(source)


@pytest.mark.parametrize(("framework", "row"), _rows(CONVERTED), ids=lambda p: getattr(p, "source", p))
def test_every_converted_row_is_converted_by_its_importer(framework, row):
    assert row.source in EXAMPLES, f"give {row.source} an example value"
    out = _translated(framework, row.source, SPELLED.get((framework, row.source), EXAMPLES[row.source]))
    by_hand = [why for key, _, why in out.unmapped if key == row.source and why.startswith("converted by hand")]
    written = set(row.targets) & (out.values.keys() | out.needs.keys())
    assert not by_hand, f"{framework} {row.source} is marked converted but left by hand"
    assert written, f"{framework} {row.source}: none of {row.targets} written"


@pytest.mark.parametrize(("framework", "row"), _rows(ADAPT), ids=lambda p: getattr(p, "source", p))
def test_every_adapt_row_asks_for_its_key_saying_how(framework, row):
    out = _translated(framework, row.source, ADAPTED[row.source])
    assert row.targets[0] in out.needs and row.note.rstrip(".") in out.needs[row.targets[0]]
    assert row.targets[0] not in out.values
