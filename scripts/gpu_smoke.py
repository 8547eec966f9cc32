"""The trainer on one GPU, without Ray or vLLM: `scripts/gpu_smoke.sh` runs this (docs/gpu.md).

A model of about 0.5B parameters built in code (the embedded transformer, 24 layers of width 1280),
bf16 compute with FSDP2 (fp32 master weights) on one GPU. It checks and reports:
- the trainer's logprobs against the torch engine's, on the same weights, at temperature 1;
- tokens/s over a few optimizer steps;
- the peak allocated GPU memory against fasync's estimate (fasync/memory.py, rule H001).
Prints a markdown table (also written to $OUT/gpu_smoke.md when OUT is set) and exits 1 when the
logprobs disagree; exits 0 with a message and nothing measured when no CUDA GPU is visible.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import torch

from fasync.config.schema import FasyncConfig
from fasync.data.rewards import BUILTIN_REWARDS
from fasync.data.tasks import generate_problems
from fasync.launch.plan import resolve
from fasync.memory import GB, RUNTIME_BYTES, estimate
from fasync.model import build_tokenizer
from fasync.rollout.build import build_engine
from fasync.rollout.types import Generation, Sample, SamplingParams
from fasync.train.batching import collate
from fasync.train.trainer import Trainer

PROMPTS, SAMPLES_PER_PROMPT, NEW_TOKENS, MEASURED_ROLLOUTS = 16, 8, 64, 3
LOGPROB_TOLERANCE = 0.02
"""Mean absolute difference allowed between trainer and engine logprobs (both bf16, one kernel apart)."""


def config(gpu_memory_gb: float) -> FasyncConfig:
    return FasyncConfig.model_validate({
        "model": {"n_layers": 24, "d_model": 1280, "n_heads": 20, "max_seq_len": 256, "dtype": "bfloat16"},
        "data": {"task": "copy", "length": 32},
        "rollout": {"batch_size": PROMPTS, "n_samples_per_prompt": SAMPLES_PER_PROMPT, "max_new_tokens": NEW_TOKENS},
        "train": {"global_batch_size": PROMPTS * SAMPLES_PER_PROMPT, "max_tokens_per_micro_batch": 4096,
                  "strategy": "fsdp2", "lr": 1e-5},
        "resources": {"num_gpus": 1, "gpus_per_engine": 1, "gpus_per_trainer_rank": 1, "colocate": True,
                      "gpu_memory_gb": gpu_memory_gb},
    })


def rollout(cfg: FasyncConfig, engine, tokenizer, version: int) -> list[Sample]:
    problems = generate_problems(cfg.data.task, cfg.data.length, PROMPTS, seed=version)
    requests = [Generation(request_id=i * SAMPLES_PER_PROMPT + j, prompt_ids=tokenizer.format_prompt(p.prompt))
                for i, p in enumerate(problems) for j in range(SAMPLES_PER_PROMPT)]
    params = SamplingParams(NEW_TOKENS, 1.0, 1.0, tokenizer.stop_token_ids)
    samples = []
    for generation in engine.generate(requests, params):
        problem = problems[generation.request_id // SAMPLES_PER_PROMPT]
        completion = tokenizer.decode(generation.output_ids)
        samples.append(Sample(group_id=generation.request_id // SAMPLES_PER_PROMPT, prompt_ids=generation.prompt_ids,
                              output_ids=generation.output_ids, behaviour_logprobs=generation.logprobs,
                              token_versions=generation.token_versions, label=problem.label, completion=completion,
                              reward=BUILTIN_REWARDS["partial_match"](completion, problem.label)))
    return samples


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_smoke: no CUDA GPU visible; nothing measured")
        return 0
    properties = torch.cuda.get_device_properties(0)
    cfg = config(properties.total_memory / GB)
    tokenizer = build_tokenizer(cfg.model, cfg.data)
    started = time.perf_counter()
    trainer = Trainer(resolve(cfg))
    engine = build_engine(cfg, tokenizer)
    engine.load_weights(trainer.rollout_state_dict(), 0)
    parameters = sum(p.numel() for p in engine.model.parameters())

    samples = rollout(cfg, engine, tokenizer, 0)
    batch = collate(samples, trainer.pad_id).to(trainer.device)
    trained = trainer._logprobs(batch)[batch.completion_mask]
    sampled = batch.behaviour_logprobs[batch.completion_mask]
    difference = (trained - sampled).abs()

    trainer.train_rollout(samples, 0)  # warm-up: allocator, kernels
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    tokens, seconds = 0, 0.0
    for version in range(1, MEASURED_ROLLOUTS + 1):
        samples = rollout(cfg, engine, tokenizer, version)
        torch.cuda.synchronize()
        step_started = time.perf_counter()
        trainer.train_rollout(samples, version)
        torch.cuda.synchronize()
        seconds += time.perf_counter() - step_started
        tokens += sum(len(s.prompt_ids) + len(s.output_ids) for s in samples)
    peak = torch.cuda.max_memory_allocated()
    resolved = resolve(cfg)
    predicted = estimate(cfg, resolved.derived, resolved.model_dims)
    # The estimate includes a fixed allowance for the CUDA context, which max_memory_allocated does not see.
    predicted_tensors = predicted.total - RUNTIME_BYTES

    rows = [
        ("GPU", f"{properties.name}, {properties.total_memory / GB:.0f} GB"),
        ("torch", torch.__version__),
        ("model", f"embedded, {parameters / 1e9:.2f}B parameters, bf16 compute, FSDP2 on 1 GPU"),
        ("trainer vs engine logprobs (temperature 1)", f"mean |Δ| {float(difference.mean()):.4f}, "
         f"max |Δ| {float(difference.max()):.4f} over {difference.numel()} tokens"),
        ("training throughput", f"{tokens / seconds:,.0f} tokens/s ({MEASURED_ROLLOUTS} steps of "
         f"{PROMPTS * SAMPLES_PER_PROMPT} samples)"),
        ("peak allocated", f"{peak / GB:.2f} GB"),
        ("fasync estimate (tensors, colocated engine included)", f"{predicted_tensors / GB:.2f} GB"),
        ("wall time", f"{time.perf_counter() - started:.0f} s"),
    ]
    table = "\n".join(["| quantity | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])
    print(table)
    print(predicted.breakdown())
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_smoke.md").write_text(
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n{table}\n\n```\n{predicted.breakdown()}\n```\n")
    if float(difference.mean()) > LOGPROB_TOLERANCE:
        print(f"gpu_smoke: trainer and engine logprobs disagree (mean |Δ| above {LOGPROB_TOLERANCE})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    random.seed(0)
    raise SystemExit(main())
