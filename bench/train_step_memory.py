"""Peak memory of one training step: the full-vocabulary scoring fasync used before, against the chunked
completion-only scoring of `fasync.model.scoring` (what the trainer does now).

    python bench/train_step_memory.py [--repeat N]

A model built in code (32k vocabulary), one micro batch of 16 sequences × 512 tokens (256 prompt, 256
completion), a forward, the PPO surrogate and a backward, on the CPU. Each measurement runs in a fresh
process, the two variants interleaved: the step's peak is the process's high-water resident set
(VmHWM) minus its resident set just before the step, so imports, the model and the batch do not count.
Large tensors are mmap'ed and given back when freed, so the high-water mark follows them.
Writes the table into docs/training.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VOCAB, ROWS, PROMPT, COMPLETION = 32_000, 16, 256, 256
MODEL = {"n_layers": 2, "d_model": 256, "n_heads": 4, "max_seq_len": PROMPT + COMPLETION}
VARIANTS = ("full vocabulary (before)", "chunked, completion only (after)")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _measure(variant: str) -> dict:
    import torch

    from fasync.model.scoring import ScoreRequest
    from fasync.model.tiny import TinyConfig, TinyTransformer
    from fasync.train.losses import aggregate, clipped_surrogate

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = TinyTransformer(TinyConfig(vocab_size=VOCAB, **MODEL)).eval()
    ids = torch.randint(3, VOCAB, (ROWS, PROMPT + COMPLETION))
    positions = torch.arange(PROMPT + COMPLETION).expand(ROWS, -1)
    advantages = torch.randn(ROWS)
    before = _status_kib("VmRSS")
    started = time.perf_counter()
    if variant == VARIANTS[0]:
        # The pre-chunking trainer: fp32 logits of every position, log-softmax, exp and the entropy, all kept
        # for backward whatever entropy_coef is.
        logits = model(ids, position_ids=positions)
        logprobs = logits[:, :-1].float().log_softmax(-1)
        logp = logprobs.gather(-1, ids[:, 1:, None]).squeeze(-1)
        entropy = -(logprobs.exp() * logprobs).sum(-1)
        mask = torch.zeros_like(logp, dtype=torch.bool)
        mask[:, PROMPT - 1:] = True
    else:
        flat = (torch.arange(ROWS)[:, None] * (PROMPT + COMPLETION) + torch.arange(PROMPT - 1, PROMPT + COMPLETION - 1))
        request = ScoreRequest(flat.reshape(-1), ids[:, PROMPT:].reshape(-1), 1.0, entropy_grad=False)
        logp, entropy = (v.view(ROWS, COMPLETION) for v in model(ids, position_ids=positions, score=request))
        mask = torch.ones_like(logp, dtype=torch.bool)
    surrogate, _ = clipped_surrogate(logp, logp.detach(), advantages, 0.2, 0.2)
    loss = aggregate(surrogate, mask, "token_mean", int(mask.sum()), ROWS) - 0.0 * aggregate(
        entropy, mask, "token_mean", int(mask.sum()), ROWS)
    loss.backward()
    seconds = time.perf_counter() - started
    return {"variant": variant, "peak_mib": (_status_kib("VmHWM") - before) / 1024, "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "training.md")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(_measure(args.variant)))
        return 0

    sys.path.insert(0, str(ROOT))
    from fasync.bench.report import commit, invocation, machine, write_block

    results: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    for _ in range(args.repeat):
        for variant in VARIANTS:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
            run = subprocess.run([sys.executable, __file__, "--variant", variant], cwd=ROOT, capture_output=True,
                                 text=True, check=True, env=env)
            results[variant].append(json.loads(run.stdout.strip().splitlines()[-1]))
            print(results[variant][-1], flush=True)
    peaks = {variant: [r["peak_mib"] for r in runs] for variant, runs in results.items()}
    ratios = [b / a for b, a in zip(peaks[VARIANTS[0]], peaks[VARIANTS[1]])]
    lines = [
        f"One step, micro batch {ROWS} × {PROMPT + COMPLETION} tokens ({COMPLETION} completion), vocabulary "
        f"{VOCAB:,}, embedded model {MODEL}; {args.repeat} runs per variant, interleaved, each in a fresh process.",
        "",
        "| scoring | peak over the step (MiB): median (min–max) | step time (s): median |",
        "|---|---|---|",
    ]
    for variant in VARIANTS:
        p = peaks[variant]
        lines.append(f"| {variant} | {statistics.median(p):.0f} ({min(p):.0f}–{max(p):.0f}) | "
                     f"{statistics.median(r['seconds'] for r in results[variant]):.2f} |")
    lines += [
        "",
        f"Peak ratio before / after: {statistics.median(ratios):.1f}x (runs: "
        f"{', '.join(f'{r:.1f}' for r in ratios)}).",
        "",
        f"Machine: {machine()}. Date: {time.strftime('%Y-%m-%d')}. Commit: {commit()}. "
        f"Command: `{invocation(sys.argv)}`.",
    ]
    write_block(args.doc, "train-step-memory", "\n".join(lines), writer="`bench/train_step_memory.py`")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
