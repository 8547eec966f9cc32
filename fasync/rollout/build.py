"""The engine `rollout.engine` names, built here so that `fasync.rollout.engine` (the interface) does not
import its own implementations."""

from __future__ import annotations

from fasync.config.schema import FasyncConfig
from fasync.rollout.engine import RolloutEngine


def build_engine(cfg: FasyncConfig, tokenizer=None, seed: int | None = None,
                 memory_fraction: float | None = None) -> RolloutEngine:
    """The engine `rollout.engine` names, holding the policy at weight version 0.

    The hf engine builds the policy exactly as the trainer does (same seed), so version 0 needs no
    push. `seed` seeds sampling (default `train.seed`): give each engine its own. `memory_fraction`: the
    share of each GPU a vLLM engine may take, as the run's plan has it (`fasync.launch.plan`)."""
    seed = cfg.train.seed if seed is None else seed
    if cfg.rollout.engine == "vllm":
        from fasync.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(cfg, seed=seed, memory_fraction=memory_fraction)
    from fasync.model import build_model, build_tokenizer
    from fasync.rollout.hf_engine import HFEngine

    tokenizer = tokenizer if tokenizer is not None else build_tokenizer(cfg.model, cfg.data, chat=cfg.rollout.agentic)
    model = build_model(cfg.model, tokenizer, seed=cfg.train.seed)
    return HFEngine(model, pad_id=tokenizer.pad_id, device=_device(cfg), seed=seed)


def _device(cfg: FasyncConfig) -> str:
    import torch

    return "cuda" if cfg.resources.gpus_per_engine > 0 and torch.cuda.is_available() else "cpu"
