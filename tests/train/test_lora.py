"""LoRA (model.lora, fasync/model/lora.py): only the adapters train, the engines get the merged weights, a
checkpoint resumes exactly and exports the adapter or the merged model."""

import json
import os
import subprocess
import sys

import pytest
import torch
from paths import REPO
from safetensors.torch import load_file
from sections import with_sections
from test_trainer import favoured_batch, favoured_probability, trainer_logprobs

from fasync.checkpoint import Checkpoint
from fasync.checkpoint.state import export_policy, load_trainer, save_trainer
from fasync.config.schema import FasyncConfig
from fasync.launch.plan import resolve
from fasync.model import build_model, build_tokenizer
from fasync.rollout.types import Sample
from fasync.train.trainer import Trainer

torch.set_num_threads(1)

BASE = {
    "model": {"n_layers": 1, "d_model": 32, "n_heads": 4, "max_seq_len": 16, "lora": {"rank": 4, "alpha": 8}},
    "data": {"task": "reverse", "length": 3},
    "rollout": {"batch_size": 4, "n_samples_per_prompt": 4, "max_new_tokens": 3},
    "train": {"global_batch_size": 16, "micro_batch_size": 8, "lr": 1e-2},
}


def config(**sections) -> FasyncConfig:
    return FasyncConfig.model_validate(with_sections(BASE, **sections))


def base_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in trainer.model.state_dict().items() if ".lora_" not in name}


def test_only_the_adapters_train_and_hold_optimizer_state():
    trainer = Trainer(resolve(config()))
    trainable = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    # The embedded model's four linear layers (qkv, proj and the two of the MLP), an A and a B each.
    assert len(trainable) == 8 and all(".lora_" in name for name in trainable)
    before = base_weights(trainer)
    trainer.train_rollout(favoured_batch(trainer), current_version=0)
    assert all(torch.equal(before[name], value) for name, value in base_weights(trainer).items())
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in trainer.model.parameters() if p.requires_grad}
    assert len(trainer.optimizer.state) == 8


def test_the_engines_get_the_merged_weights_under_the_base_models_names():
    cfg = config()
    trainer = Trainer(resolve(cfg))
    samples = favoured_batch(trainer)
    trainer.train_rollout(samples, current_version=0)
    merged = trainer.rollout_state_dict()
    plain = build_model(cfg.model, build_tokenizer(cfg.model, cfg.data), seed=cfg.train.seed)
    assert merged.keys() == plain.state_dict().keys()
    plain.load_state_dict(merged)
    # The merged model scores the samples as the adapted one does: fp32, W + ΔW summed once against the
    # adapter's separate x W + x ΔW: a few ulps of logprobs of order 1.
    adapted = trainer_logprobs(trainer, samples)
    trainer.model = plain
    for got, expected in zip(trainer_logprobs(trainer, samples), adapted):
        assert got == pytest.approx(expected, abs=1e-5)


def test_a_checkpoint_resumes_the_adapters_exactly_and_exports_adapter_or_merged_model(tmp_path):
    cfg = config()
    straight, resumed = Trainer(resolve(cfg)), Trainer(resolve(cfg))
    samples = favoured_batch(straight)
    straight.train_rollout(samples, current_version=0)
    save_trainer(straight, tmp_path)
    load_trainer(resumed, tmp_path)
    straight.train_rollout(favoured_batch(straight), 0)
    resumed.train_rollout(favoured_batch(resumed), 0)
    assert all(torch.equal(value, resumed.model.state_dict()[name])
               for name, value in straight.model.state_dict().items())

    checkpoint = Checkpoint(tmp_path, {"step": 1})
    adapter = export_policy(cfg, checkpoint, tmp_path / "adapter")
    assert adapter == ["adapter_config.json", "adapter_model.safetensors", "fasync_model.json"]
    tensors = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert len(tensors) == 8 and all(name.startswith("base_model.model.blocks.0.") for name in tensors)
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 4
    assert "model.safetensors" in export_policy(cfg, checkpoint, tmp_path / "merged", merge=True)
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert merged.keys() == build_model(cfg.model, build_tokenizer(cfg.model, cfg.data), seed=0).state_dict().keys()


def test_the_adapters_alone_raise_the_rewarded_tokens_probability():
    """The fixed batch of tests/train/test_trainer.py: three steps move the favoured token's mean probability from
    0.060 to 0.089 (measured, the same in every process now that the adapters are drawn from the seed); 0.02 leaves
    room for other CPUs' rounding, far above none at all."""
    trainer = Trainer(resolve(config()))
    samples = favoured_batch(trainer)
    before = favoured_probability(trainer)
    for _ in range(3):
        trainer.train_rollout([Sample(**vars(s)) for s in samples], current_version=0)
    assert favoured_probability(trainer) > before + 0.02


def test_a_hugging_face_model_takes_adapters_on_every_linear_layer_but_the_head(tmp_path):
    from peft import PeftModel
    from tiny_models import write_tiny_llama
    from transformers import AutoModelForCausalLM

    write_tiny_llama(tmp_path / "llama")
    cfg = FasyncConfig.model_validate({
        "model": {"path": str(tmp_path / "llama"), "lora": {"rank": 2}},
        "data": {"task": "reverse", "length": 3},
        "rollout": {"batch_size": 2, "n_samples_per_prompt": 2, "max_new_tokens": 3},
        "train": {"global_batch_size": 4, "micro_batch_size": 4, "lr": 1e-2}})
    trainer = Trainer(resolve(cfg))
    adapted = {name.split(".lora_")[0] for name, p in trainer.model.named_parameters() if p.requires_grad}
    # Two layers of seven projections each (q, k, v, o; gate, up, down); never lm_head.
    assert len(adapted) == 14 and not any("lm_head" in name for name in adapted)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "llama")
    assert trainer.rollout_state_dict().keys() == {f"lm.{name}" for name in plain.state_dict()}
    # What `fasync export` writes loads onto the base model with peft.
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if ".lora_B" in name:
                p.fill_(0.01)  # B starts at 0: give the adapter something to carry
    save_trainer(trainer, tmp_path / "run")
    export_policy(cfg, Checkpoint(tmp_path / "run", {"step": 0}), tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(plain, tmp_path / "adapter")
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        expected = trainer.model.lm(ids).logits
        got = loaded(ids).logits
    # fp32, the same adapters applied to the same weights by the same peft layers.
    assert torch.allclose(got, expected, atol=1e-5)


ADAPTERS_DRAWN = """
import torch
from fasync.config.schema import FasyncConfig
from fasync.launch.plan import resolve
from fasync.train.trainer import Trainer
cfg = FasyncConfig.model_validate({"model": {"n_layers": 1, "d_model": 32, "n_heads": 4, "max_seq_len": 16,
                                             "lora": {"rank": 4, "alpha": 8}}})
adapters = [p for name, p in Trainer(resolve(cfg)).model.named_parameters() if "lora_A" in name]
print([float(p.double().sum()) for p in adapters])
"""


def test_the_adapters_are_drawn_from_the_seed_alike_in_every_process():
    """peft draws them from the global generator, which Python's hash seed left in another state in each
    process: the same config trained differently (the test above failed about 1 run in 6)."""
    def drawn(hash_seed: str) -> str:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO)}
        return subprocess.run([sys.executable, "-c", ADAPTERS_DRAWN], env=env, cwd=REPO, capture_output=True,
                              text=True, check=True).stdout
    assert drawn("1") == drawn("2") == drawn("3")
