"""The per-GPU memory estimate (fasync/memory.py) against a hand calculation, the strategy default, and H001
on a real config.json."""

import json

import pytest

from fasync.config.derived import derive
from fasync.config.schema import FasyncConfig
from fasync.launch.plan import resolve
from fasync.memory import GB, estimate, model_dims

QWEN25_7B = {  # the dimensions of Qwen2.5-7B's config.json
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
    "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064, "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
}


def qwen_config(tmp_path, **sections) -> FasyncConfig:
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    base = {
        "model": {"path": str(tmp_path), "dtype": "bfloat16"},
        "data": {"max_prompt_tokens": 1024},
        "rollout": {"engine": "vllm", "max_new_tokens": 1024},
        "train": {"strategy": "fsdp2", "activation_checkpointing": True, "max_tokens_per_micro_batch": 8192},
        "resources": {"num_gpus": 16, "num_rollout_engines": 8, "gpus_per_engine": 1, "trainer_ranks": 8,
                      "gpus_per_trainer_rank": 1},
    }
    for name, values in sections.items():
        base[name] = {**base[name], **values}
    return FasyncConfig.model_validate(base)


def test_qwen25_7b_bf16_fsdp2_over_eight_gpus_by_hand(tmp_path):
    cfg = qwen_config(tmp_path)
    h, i, layers, vocab, kv = 3584, 18944, 28, 152064, 4 * 128
    # One layer: q and o (h × h), k and v (h × kv), q/k/v biases, the gated MLP (3 × h × i), two RMS norms.
    layer = 2 * h * h + 2 * h * kv + (h + 2 * kv) + 3 * h * i + 2 * h
    root = 2 * vocab * h + h  # untied embedding and output projection, final norm
    parameters = layers * layer + root
    assert layer == 233_057_792 and parameters == 7_615_616_512  # Qwen2.5-7B: 7.62B parameters

    tokens, completion = 8192, 4 * 1024  # four 2048-token sequences per micro batch, 1024 of each completion
    chunk = 2**26 // vocab  # 441 positions of fp32 logits at a time
    expected = {
        "fp32 master weights": 4 * parameters / 8,
        "fp32 gradients": 4 * parameters / 8,
        "AdamW moments": 8 * parameters / 8,
        "gathered parameters": 2 * (root + 2 * layer),  # bf16
        "unsharded layer gradients": 4 * layer,
        "layer inputs (checkpointed)": layers * h * 2 * tokens,
        "one layer's activations": (7 * h + 2 * kv + 4 * i) * 2 * tokens,
        "scored hidden states": completion * h * 2,
        "logits chunk": 2 * 4 * chunk * vocab,
        "CUDA context and buffers": 1e9,
    }
    found = estimate(cfg, derive(cfg), model_dims(cfg))
    assert {term.name: term.bytes for term in found.terms} == pytest.approx(expected)
    # 3.81 + 3.81 + 7.62 + 3.11 + 0.93 + 1.64 + 1.67 + 0.03 + 0.54 + 1.00
    assert found.total / GB == pytest.approx(24.15, abs=0.01)


def test_the_same_model_without_sharding_or_checkpointing_does_not_fit(tmp_path):
    cfg = qwen_config(tmp_path, train={"strategy": "ddp", "activation_checkpointing": False})
    found = estimate(cfg, derive(cfg), model_dims(cfg))
    # 16 bytes per parameter (122 GB) before any activation: no 80 GB GPU holds a replica with AdamW.
    assert found.total > 16 * 7_615_616_512
    assert resolve(qwen_config(tmp_path, train={"strategy": None})).derived.train_strategy == "fsdp2"


def test_h001_reports_the_arithmetic_and_the_key_to_change(tmp_path):
    from fasync.lint.engine import rules

    def h001(cfg):
        return list(rules()["H001"].check(cfg, derive(cfg)))

    [finding] = h001(qwen_config(tmp_path, resources={"trainer_ranks": 2}, train={"activation_checkpointing": False}))
    assert finding.key == "resources.gpu_memory_gb"
    assert "AdamW moments: 8 B × 7,615,616,512 / 2 ranks = 30.46 GB" in finding.message
    assert "total:" in finding.message
    assert h001(qwen_config(tmp_path)) == []


def test_strategy_defaults_by_size():
    small = FasyncConfig.model_validate({"resources": {"trainer_ranks": 2, "gpus_per_trainer_rank": 1,
                                                       "num_gpus": 2}})
    assert resolve(small).derived.train_strategy == "ddp"
    # 1.5B parameters: 24 GB of replica and AdamW state, over a quarter of an 80 GB GPU.
    large = FasyncConfig.model_validate({"model": {"n_layers": 30, "d_model": 2048, "n_heads": 16},
                                         "resources": {"trainer_ranks": 2, "gpus_per_trainer_rank": 1,
                                                       "num_gpus": 2}})
    assert model_dims(large).parameters > 1.5e9 and resolve(large).derived.train_strategy == "fsdp2"
    on_cpu = FasyncConfig.model_validate({"model": {"n_layers": 24, "d_model": 2048, "n_heads": 16},
                                          "resources": {"trainer_ranks": 2}})
    assert resolve(on_cpu).derived.train_strategy == "ddp"


def test_embedded_dims_count_the_parameters_the_model_has():
    import torch  # noqa: F401 - the embedded model itself

    from fasync.model import build_model, build_tokenizer

    cfg = FasyncConfig.model_validate({"model": {"n_layers": 3, "d_model": 48, "n_heads": 4, "max_seq_len": 40}})
    model = build_model(cfg.model, build_tokenizer(cfg.model, cfg.data), seed=0)
    assert model_dims(cfg).parameters == sum(p.numel() for p in model.parameters())
