"""The small trainer setting that several ranks and one rank train alike (data parallel, FSDP2, sharded
checkpoints), its made-up rollout, and what "alike" means for their records and weights."""

import gc
import random

import torch.distributed as dist

from fasync.rollout.types import GroupId, Sample

SETTINGS = {
    "model": {"n_layers": 1, "d_model": 32, "n_heads": 4, "max_seq_len": 16},
    "data": {"task": "reverse", "length": 3},
    "rollout": {"batch_size": 4, "n_samples_per_prompt": 4, "max_new_tokens": 3},
    # Two steps of 8: each rank takes 4 samples a step, in 2 micro batches of 2. The learning rate keeps the
    # ranks' weights within WEIGHT_TOLERANCE of one rank's (below).
    "train": {"global_batch_size": 8, "micro_batch_size": 2, "num_steps_per_rollout": 2, "lr": 1e-3,
              "kl_coef": 0.05, "entropy_coef": 0.01},
    # Token-level weights from made-up behaviour logprobs: the correction path runs on every rank too.
    "correction": {"level": "token", "weight_upper": 1.5},
}


RECORD_TOLERANCE = dict(rel=1e-5, abs=4e-6)
"""Step records are fp32 means over a step's 16 to 48 tokens, which ranks sum in another order than one rank
does: a mean of n terms rounds by at most (n - 1) * 2**-24 of the mean of their magnitudes. That is 2.8e-6
relative for same-signed terms (entropy, weights, grad_norm): rel=1e-5. Where terms cancel (pg_loss, with
|A·r| up to about 1.3 and Σ A ≈ 0) it is an absolute 3.7e-6: abs=4e-6. Measured: 2.4e-7 on an AMD EPYC."""


WEIGHT_TOLERANCE = 1e-5
"""AdamW divides each gradient by its own running scale, so where a gradient is tiny its fp32 rounding
(which differs with the micro batches' order of summation) becomes a relative error of the update: after
four steps at lr 1e-2 the weights differed by up to 6.3e-6 (AMD EPYC; 2e-5 with FSDP2), at 3e-3 1.2e-5,
and at lr 1e-3 by 6.3e-7. So SETTINGS trains at 1e-3, where this bound holds with a factor 16."""


COMPARED = ["loss", "pg_loss", "kl", "entropy", "clip_fraction", "grad_norm", "num_tokens", "num_samples",
            "is/kl_k3", "is/weight_mean", "is/weight_max", "is/truncated_token_frac"]


def rollout(seed: int) -> list[Sample]:
    """Sixteen completions of 1 to 3 tokens (so ranks hold different token counts), four per group."""
    rng = random.Random(seed)
    samples = []
    for index in range(16):
        length = rng.randint(1, 3)
        samples.append(Sample(
            group_id=GroupId(index // 4), prompt_ids=[1] + [rng.randint(3, 12) for _ in range(3)] + [14],
            output_ids=[rng.randint(2, 12) for _ in range(length)],
            behaviour_logprobs=[-rng.uniform(1.5, 3.5) for _ in range(length)],
            token_versions=[0] * length, reward=float(rng.random() < 0.5)))
    return samples


def leave_group() -> None:
    """End a spawned rank's process group once the rank's trainer is out of scope. FSDP2's modules hold the
    gloo group in reference cycles; left to the interpreter's exit, the group is destroyed among C++ statics
    and its threads can abort the process ("terminate called without an active exception": 4 in 42 runs of
    the sharded checkpoint test on an AMD EPYC, none in 45 once the trainer is collected first)."""
    gc.collect()
    dist.destroy_process_group()
