"""Generation tokens/s of vLLM's CPU build against fasync's torch engine, on the same Llama at three sizes.

    .venv-vllm/bin/python bench/vllm_cpu.py [--repeat N] [--write]

Each size runs in a process of its own (one vLLM engine per process): both engines get the same batch of
prompts, generate a fixed number of tokens each (no stop ids, so both do the same work), and take turns,
`--repeat` times each after one warm-up call apiece. Reports the median and the range of tokens/s, and with
`--write` rewrites the `vllm-cpu` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = [(128, 2), (256, 4), (512, 8)]
"""(hidden size, heads): head size 64 throughout, which vLLM's CPU attention supports."""
BATCH, NEW_TOKENS, LAYERS = 16, 32, 4
BEGIN, END = "<!-- vllm-cpu:begin -->", "<!-- vllm-cpu:end -->"


def measure(hidden: int, heads: int, repeat: int) -> dict:
    """Runs in the per-size process: tokens/s of each engine, interleaved."""
    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    from test_hf_model import write_tiny_llama

    from fasync.config.schema import FasyncConfig
    from fasync.model import build_model, build_tokenizer
    from fasync.rollout.build import build_engine
    from fasync.rollout.hf_engine import HFEngine
    from fasync.rollout.types import Generation, SamplingParams

    directory = Path(tempfile.mkdtemp(prefix="fasync-bench-vllm-"))
    write_tiny_llama(directory, hidden_size=hidden, heads=heads)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "num_hidden_layers": LAYERS}))
    import transformers

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**config, "num_hidden_layers": LAYERS})
                                  ).save_pretrained(directory)
    cfg = FasyncConfig.model_validate({"model": {"path": str(directory)}, "rollout": {"engine": "vllm"}})
    tokenizer = build_tokenizer(cfg.model, cfg.data)
    model = build_model(cfg.model, tokenizer, seed=0).eval()
    engines = {"vllm": build_engine(cfg, tokenizer), "torch": HFEngine(model, pad_id=tokenizer.pad_id)}
    prompts = [tokenizer.format_prompt(f"{i}+{i * 7 % 10}=?") for i in range(BATCH)]
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for turn in range(repeat + 1):
        for name, engine in engines.items():
            started = time.perf_counter()
            out = engine.generate([Generation(i, p) for i, p in enumerate(prompts)], params)
            seconds = time.perf_counter() - started
            if turn:  # the first call of each warms up
                rates[name].append(sum(len(g.output_ids) for g in out) / seconds)
    parameters = sum(p.numel() for p in model.parameters())
    return {"hidden": hidden, "heads": heads, "parameters": parameters, "rates": rates,
            "threads": torch.get_num_threads()}


def table(results: list[dict]) -> str:
    rows = ["| model (4 layers) | parameters | torch engine tokens/s | vLLM CPU tokens/s | vLLM / torch |",
            "|---|---|---|---|---|"]
    for r in results:
        torch_rate, vllm_rate = (statistics.median(r["rates"][k]) for k in ("torch", "vllm"))
        spread = {k: f"{min(v):.0f}–{max(v):.0f}" for k, v in r["rates"].items()}
        rows.append(f"| hidden {r['hidden']}, {r['heads']} heads of 64 | {r['parameters']:,} | {torch_rate:.0f} "
                    f"({spread['torch']}) | {vllm_rate:.0f} ({spread['vllm']}) | {vllm_rate / torch_rate:.2f}× |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="rewrite the vllm-cpu section of docs/benchmarks.md")
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.size is not None:
        hidden, heads = SIZES[args.size]
        print(json.dumps(measure(hidden, heads, args.repeat)))
        return 0
    results = []
    for index in range(len(SIZES)):
        done = subprocess.run([sys.executable, __file__, "--size", str(index), "--repeat", str(args.repeat)],
                              capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(table(results).splitlines()[-1], flush=True)
    import vllm

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    text = (f"{BEGIN}\n<!-- Written by `bench/vllm_cpu.py --write`; rerun it instead of editing. -->\n"
            f"{BATCH} prompts, {NEW_TOKENS} new tokens each (no stop ids), temperature 1; median tokens/s over "
            f"{args.repeat} calls per engine, taken in turn after one warm-up call each (range in brackets). vLLM "
            f"{vllm.__version__} (CPU build, eager, in-process engine core), torch engine on "
            f"{results[0]['threads']} thread(s). Machine: {platform.machine()}, {os.cpu_count()} cores, "
            f"{time.strftime('%Y-%m-%d')}, commit {commit.strip()}. "
            f"Command: `.venv-vllm/bin/python bench/vllm_cpu.py --repeat {args.repeat} --write`.\n\n"
            f"{table(results)}\n{END}")
    print(text)
    if args.write:
        path = ROOT / "docs" / "benchmarks.md"
        doc = path.read_text()
        if BEGIN in doc:
            doc = doc[:doc.index(BEGIN)] + text + doc[doc.index(END) + len(END):]
        else:
            doc += ("\n## vLLM's CPU build against the torch engine\n\nGeneration throughput of the two engines on "
                    "the same model (bench/vllm_cpu.py; not part of `fasync bench`).\n\n" + text + "\n")
        path.write_text(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
