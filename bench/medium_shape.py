"""A medium shape, measured against the machine's limit (issue 31 §1): a 26 M-parameter Llama written here in code,
with a byte-level BPE tokenizer trained here and a chat template, on a task whose answers are 64 tokens long,
trained by `fasync train` in sync, async and fully_async; each phase's FLOP/s against a torch matmul peak.

    python bench/medium_shape.py [--rollouts 6] [--out DIR] [--no-write] [--vllm-python .venv-vllm/bin/python]
    python bench/medium_shape.py --profile-only    # the peak and the profiled calls only, as one JSON line

- the model: `LlamaForCausalLM` of `MODEL` (8 layers, 512 wide), float32, seed 0; the tokenizer: BPE over bytes
  trained with `tokenizers` on sentences of the task's `WORDS` pseudo-words (each word becomes one token), a chat
  template that wraps the prompt in `<|user|>` … `<|assistant|>`; both saved in one directory (`model.path`);
- the task: "reverse:" and 64 of those words; the answer is the words in reverse order (64 tokens, then `</s>`);
  the reward `fasync.bench.rewards:word_match`, the fraction of word positions right;
- the runs: `rollout.batch_size` 4 prompts × 4 samples, at most 80 new tokens, one optimizer step per rollout,
  `resources.rollout_threads=1 resources.train_threads=1` (one torch thread per actor), each mode's sections from
  its example config (fasync.bench.modes), `--rollouts` rollouts each or until the target reward;
- the peak: `fasync.bench.flops.matmul_peak` (float32 1024³ products, one thread) in this process before each run
  and after the last, interleaved with them;
- the profile: one generate call and one optimizer step (`Trainer.train_rollout`) in this process, one thread,
  after a warm-up call of each, under torch.profiler: the top entries by self CPU time; the generate call's
  prefill and decode steps timed apart, beside the decoder's products alone at the decode's rows; with
  `--vllm-python`, the same generate call on vLLM's CPU engine in a process of that Python.

Writes the blocks `medium-setup`, `medium-modes`, `medium-peak` and `medium-profile` into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fasync.bench.flops import LlamaShape, matmul_peak  # noqa: E402
from fasync.bench.medium import (  # noqa: E402
    MAX_NEW_TOKENS,
    MODEL,
    POOL,
    PROMPTS,
    REVERSE,
    SAMPLES,
    TEMPLATE,
    WORDS,
    WORDS_PER_PROMPT,
    MediumFiles,
    write_files,
)
from fasync.bench.modes import Scenario, ScenarioResult, Variant, read_run_dir, run_scenario  # noqa: E402
from fasync.bench.report import (  # noqa: E402
    fmt,
    load_average,
    load_sentence,
    measured,
    mode_table,
    overlap_table,
    parallel_capacity,
    phase_table,
    spread,
    table,
    under_load,
    write_block,
)
from fasync.bench.rewards import word_match  # noqa: E402
from fasync.bench.timing import timed_method  # noqa: E402
from fasync.metrics.measure import REWARD_WINDOW, last_per_rollout  # noqa: E402
from fasync.modes import MODES  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
THREADS = 1
TOP = 12
MATMUL_SIZE = 1024


# -- the task's token lengths ----------------------------------------------------------------------


def token_lengths(model: Path, rows: list[dict]) -> tuple[list[int], list[int]]:
    """Each prompt's tokens through the chat template, and each answer's tokens with the `</s>` that ends it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [len(tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}], tokenize=True,
                                                 add_generation_prompt=True, return_dict=False)) for row in rows]
    answers = [len(tokenizer(row["label"], add_special_tokens=False)["input_ids"]) + 1 for row in rows]
    return prompts, answers


# -- FLOPs of the runs' phases ---------------------------------------------------------------------


def phase_rates(records: list[dict], shape: LlamaShape, prompt_tokens: float) -> dict:
    """Over the steady window (the rollouts after the first, as fasync.metrics.measure takes it): the FLOPs of
    the trained samples' optimizer steps and of their generation, and the seconds of each phase. Each step's
    samples are counted at its mean completion length (`num_tokens / num_samples`): attention, the only term
    not linear in the length, is under 3 % of the total here."""
    first = last_per_rollout(records)[0]["rollout"] if records else 0
    window = [r for r in records if r["rollout"] != first]
    train = generate = 0.0
    for row in window:
        samples = row.get("num_samples") or 0
        if samples:
            completion = row["num_tokens"] / samples
            train += samples * shape.train_flops(prompt_tokens, completion)
            generate += samples * shape.generate_flops(prompt_tokens, completion)
    return {"train_flops": train, "generate_flops": generate,
            "train_s": sum(r.get("train_time_s") or 0.0 for r in window),
            "generate_s": sum(r.get("generate_time_s") or 0.0 for r in window),
            "steps": len(window), "completion_tokens": sum(r.get("num_tokens") or 0 for r in window),
            "step_s": [r["train_time_s"] for r in window if r.get("train_time_s") is not None]}


def reward_reached(records: list[dict]) -> tuple[float | None, float | None]:
    """(the mean reward of the last `REWARD_WINDOW` rollouts, the best single rollout's)."""
    rewards = [r["rollout_reward_mean"] for r in last_per_rollout(records) if r.get("rollout_reward_mean") is not None]
    return (statistics.mean(rewards[-REWARD_WINDOW:]) if rewards else None), (max(rewards) if rewards else None)


# -- the profile of one generate call and one optimizer step ----------------------------------------


MATRIX_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
              "aten::_scaled_dot_product_flash_attention_for_cpu_backward")
"""The operators that are matrix products (linear layers, attention): their share of the self CPU time is what
the FLOP count counts; the rest is overhead the count leaves out."""


def top_entries(profiler, top: int) -> dict:
    events = [e for e in profiler.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    ranked = sorted(events, key=lambda e: -e.self_cpu_time_total)
    return {"total_ms": total / 1000,
            "matrix_share": sum(e.self_cpu_time_total for e in events if e.key in MATRIX_OPS) / total if total else 0.0,
            "top": [{"name": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1000,
                     "share": e.self_cpu_time_total / total} for e in ranked[:top]]}


def cache_appends(call) -> dict:
    """Seconds of an unprofiled call, and of them the seconds the model's KV cache spent storing each forward's keys
    and values (transformers' `Cache.update`, which hands them to each layer's cache), and the class of those layers:
    the profiler's own overhead lands on the many small operators of these updates, so they are timed here without
    it."""
    from transformers import cache_utils

    storing = cache_utils.Cache.update
    spent, layer_classes = [0.0], set()

    def timed_update(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return storing(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - started
            layer_classes.update(type(layer).__name__ for layer in self.layers)

    cache_utils.Cache.update = timed_update
    try:
        started = time.perf_counter()
        call()
        return {"appends_call_s": time.perf_counter() - started, "cache_append_s": spent[0],
                "cache_layers": sorted(layer_classes)}
    finally:
        cache_utils.Cache.update = storing


def decode_products(shape: LlamaShape, rows: int, seconds: float = 1.0) -> float:
    """GFLOP/s per CPU second of the decoder's linear layers on `rows` rows, as one decode step of that many
    sequences runs them: every layer's q, k, v, o, gate, up and down products in turn, each layer with weights of
    its own, so that each weight comes from memory as in the model. What a decode step would reach if it were
    only its products."""
    import torch
    from torch.nn.functional import linear

    queries, keys = shape.heads * shape.width_per_head, shape.kv_heads * shape.width_per_head
    products = [(shape.hidden, queries), (shape.hidden, keys), (shape.hidden, keys), (queries, shape.hidden),
                (shape.hidden, shape.intermediate), (shape.hidden, shape.intermediate),
                (shape.intermediate, shape.hidden)]
    weights = [torch.randn(out, width) for _ in range(shape.layers) for width, out in products]
    inputs = {width: torch.randn(rows, width) for width, _ in products}

    def step():
        for weight in weights:
            linear(inputs[weight.shape[1]], weight)

    step()
    steps, started = 0, time.process_time()
    while time.process_time() - started < seconds:
        step()
        steps += 1
    return 2 * rows * sum(w.numel() for w in weights) * steps / (time.process_time() - started) / 1e9


def timed(call):
    """The call's value, its wall seconds and the CPU seconds this process spent in it: on a loaded machine the
    process waits for a core, which the wall time counts and the CPU time does not."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = call()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def rollout_call(config: Path, rows: list[dict], overrides: tuple[str, ...] = ()):
    """The config (one thread per actor), its tokenizer, the engine `rollout.engine` names, and one rollout's
    generate call: its sampling parameters, the problems of its samples and their requests."""
    from fasync.config.loader import load_config
    from fasync.model import build_tokenizer
    from fasync.rollout.build import build_engine
    from fasync.rollout.types import Generation, SamplingParams

    cfg = load_config(str(config), ["resources.rollout_threads=1", "resources.train_threads=1", *overrides]).config
    tokenizer = build_tokenizer(cfg.model, cfg.data)
    engine = build_engine(cfg, tokenizer)
    params = SamplingParams(MAX_NEW_TOKENS, cfg.rollout.temperature, stop_token_ids=tokenizer.stop_token_ids)
    chosen = [rows[i // SAMPLES] for i in range(PROMPTS * SAMPLES)]
    requests = [Generation(i, tokenizer.format_prompt(row["prompt"])) for i, row in enumerate(chosen)]
    return cfg, tokenizer, engine, params, chosen, requests


def vllm_generate(out: Path, calls: int = 2) -> dict:
    """In a process of vLLM's CPU build (`--vllm-python`): the profiled generate call on vLLM's engine, after a
    warm-up call, `calls` times: wall and CPU seconds, and the tokens generated."""
    import torch

    torch.set_num_threads(THREADS)
    rows = MediumFiles(out).rows()
    _, _, engine, params, _, requests = rollout_call(out / "medium.yaml", rows, ("rollout.engine=vllm",))
    engine.generate(requests, params)
    found: dict = {"s": [], "cpu_s": [], "prompt_tokens": [], "completion_tokens": []}
    for _ in range(calls):
        generations, seconds, cpu = timed(lambda: engine.generate(requests, params))
        found["s"].append(seconds)
        found["cpu_s"].append(cpu)
        found["prompt_tokens"].append(statistics.mean(len(g.prompt_ids) for g in generations))
        found["completion_tokens"].append(statistics.mean(len(g.output_ids) for g in generations))
    import vllm

    return {**found, "samples": len(requests), "vllm": vllm.__version__, "threads": torch.get_num_threads()}


def run_vllm(python: str, out: Path) -> dict:
    """`vllm_generate` in a child process of `python`, one OpenMP thread; its error when it fails."""
    done = subprocess.run([python, __file__, "--vllm-child", str(out)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(THREADS)},
                          timeout=900, check=False)
    if done.returncode != 0:
        return {"error": done.stderr[-1500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def profile_calls(config: Path, rows: list[dict], shape: LlamaShape, top: int) -> dict:
    """One generate call of a rollout's prompts and one optimizer step on its samples, each after an unprofiled
    warm-up call (timed: the call's time without the profiler's overhead), in this process."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from fasync.launch.plan import resolve
    from fasync.rollout.types import GroupId, Sample
    from fasync.train.trainer import Trainer

    cfg, tokenizer, engine, params, chosen, requests = rollout_call(config, rows)
    trainer = Trainer(resolve(cfg))
    # The prefill: one forward over the distinct left-padded prompts; the rest of a generate call is its decode steps.
    with timed_method(engine, "_prefill", time.process_time) as prefill_cpu_s:
        _, generate_s, generate_cpu_s = timed(lambda: engine.generate(requests, params))
    appending = cache_appends(lambda: engine.generate(requests, params))
    with profile(activities=[ProfilerActivity.CPU]) as generate_profile:
        generations, profiled_generate_s, _ = timed(lambda: engine.generate(requests, params))

    def samples():
        out = []
        for index, (row, generation) in enumerate(zip(chosen, generations)):
            completion = tokenizer.decode(generation.output_ids)
            out.append(Sample(GroupId(index // SAMPLES), generation.prompt_ids, generation.output_ids,
                              generation.logprobs, generation.token_versions, word_match(completion, row["label"]),
                              row["label"], completion, generation.finish_reason))
        return out

    _, step_s, step_cpu_s = timed(lambda: trainer.train_rollout(samples(), 0))
    with profile(activities=[ProfilerActivity.CPU]) as step_profile:
        _, profiled_step_s, _ = timed(lambda: trainer.train_rollout(samples(), 0))
    prompt = statistics.mean(len(g.prompt_ids) for g in generations)
    completion = statistics.mean(len(g.output_ids) for g in generations)
    count = len(generations)
    return {"samples": count, "prompt_tokens": prompt, "completion_tokens": completion,
            "generate": {"s": generate_s, "cpu_s": generate_cpu_s, "profiled_s": profiled_generate_s, **appending,
                         "flops": count * shape.generate_flops(prompt, completion),
                         # The engine prefills each distinct prompt once for all its samples (HFEngine._prefill).
                         "prefill_cpu_s": prefill_cpu_s[0], "prefill_flops": PROMPTS * shape.generate_flops(prompt, 0),
                         "decode_flops": count * (shape.generate_flops(prompt, completion) - shape.generate_flops(prompt, 0)),
                         "decode_products_gflops": decode_products(shape, count),
                         **top_entries(generate_profile, top)},
            "step": {"s": step_s, "cpu_s": step_cpu_s, "profiled_s": profiled_step_s, "flops": count * shape.train_flops(prompt, completion),
                     **top_entries(step_profile, top)},
            "threads": torch.get_num_threads()}


def profile_fractions(profile: dict, peaks: list[float]) -> dict:
    """Per profiled call: its wall and CPU seconds, the seconds its KV cache spent storing, and its FLOPs per CPU
    second as a fraction of the best peak (`--profile-only`)."""
    peak = max(peaks)
    return {"peaks": peaks, "load": list(os.getloadavg()), **{
        name: {"s": call["s"], "cpu_s": call["cpu_s"], "cache_append_s": call.get("cache_append_s"),
               "cpu_of_peak": call["flops"] / call["cpu_s"] / 1e9 / peak, "wall_of_peak": call["flops"] / call["s"] / 1e9 / peak}
        for name, call in (("generate", profile["generate"]), ("step", profile["step"]))},
        "generate_phases": {phase: rate / peak for phase, rate in generate_phases(profile["generate"]).items()}}


def generate_phases(call: dict) -> dict[str, float]:
    """GFLOP/s per CPU second of a profiled generate call's prefill and of its decode steps (the rest of the call),
    and of the decoder's products alone at the decode's rows (`decode_products`)."""
    decode_s = call["cpu_s"] - call["prefill_cpu_s"]
    return {"prefill": call["prefill_flops"] / call["prefill_cpu_s"] / 1e9,
            "decode": call["decode_flops"] / decode_s / 1e9,
            "decode_products": call["decode_products_gflops"]}


# -- the page --------------------------------------------------------------------------------------


def render(saved: dict, command: str) -> dict[str, str]:
    shape = LlamaShape(**saved["shape"])
    peaks = saved["peaks"]
    # Other work on the machine only slows a measurement down: the best one is the nearest to the machine's peak,
    # the median what a phase could count on under this run's load.
    peak, typical = max(peaks), statistics.median(peaks)
    result = saved["result"]
    labels = list(result["rates"])
    prompt, answer = saved["prompt_tokens"], saved["answer_tokens"]
    setup = "\n".join([
        f"- {command}",
        f"- {load_sentence(saved['load_before'], saved['load_after'], saved['capacity'])}"
        + ("; the peak was measured under the same load" if under_load(saved["load_before"], saved["capacity"]) else ""),
        f"- model: `LlamaForCausalLM` {json.dumps(MODEL)}, vocabulary {shape.vocab} (byte-level BPE trained in "
        f"code on the task's {WORDS} pseudo-words, chat template `{TEMPLATE}`), float32, seed 0: "
        f"{shape.body_parameters / 1e6:.2f} M weights in the decoder's linear layers, {shape.head_parameters / 1e6:.2f} M "
        f"in the output projection, {saved['parameters'] / 1e6:.2f} M in all",
        f"- task: `reverse:` and {WORDS_PER_PROMPT} words; the answer is the words in reverse order; prompts "
        f"{spread(prompt, 0)} tokens through the chat template, answers {spread(answer, 0)} tokens with their `</s>`; "
        "reward `fasync.bench.rewards:word_match` (the fraction of word positions right, over the longer of "
        f"completion and answer); {POOL} prompts written by the benchmark",
        f"- every run: {PROMPTS} prompts × {SAMPLES} samples per rollout, `rollout.max_new_tokens={MAX_NEW_TOKENS}`, "
        f"one optimizer step per rollout (`train.global_batch_size={PROMPTS * SAMPLES}`, one micro batch), "
        f"lr {REVERSE.lr}, `resources.rollout_threads=1 resources.train_threads=1` (one torch thread per actor), "
        f"at most {saved['rollouts']} rollouts or until a 3-rollout mean reward of {REVERSE.target}; each mode's "
        "`async` and `correction` sections from its example config",
    ])
    def of_peak(rate: float | None) -> list[str]:
        return [fmt(rate / peak, 2), fmt(rate / typical, 2)] if rate else ["—", "—"]

    rows, fraction_rows = [], []
    reports = result["reports"]
    for label in labels:
        rates, report = result["rates"][label], reports[label]
        window = report["window_s"]
        last, best = result["rewards"][label]
        reached = report["time_to_target_s"]
        steps = rates["steps"]
        rows.append([label, report["exit_code"], report["rollouts"], fmt(report["samples_per_s"], 2),
                     fmt(rates["completion_tokens"] / window, 0) if window else "—",
                     fmt(1000 * statistics.median(rates["step_s"]), 0) if rates["step_s"] else "—",
                     fmt(1000 * window / steps, 0) if steps else "—",
                     f"{fmt(last, 3)} (best {fmt(best, 3)})",
                     fmt(reached, 1) if reached is not None else "not reached"])
        train_rate = rates["train_flops"] / rates["train_s"] / 1e9 if rates["train_s"] else None
        generate_rate = rates["generate_flops"] / rates["generate_s"] / 1e9 if rates["generate_s"] else None
        fraction_rows.append([label, fmt(rates["train_flops"] / 1e12, 2), fmt(rates["train_s"], 1),
                              fmt(train_rate, 1), *of_peak(train_rate),
                              fmt(rates["generate_flops"] / 1e12, 2), fmt(rates["generate_s"], 1),
                              fmt(generate_rate, 1), *of_peak(generate_rate)])
    modes = "\n\n".join([
        table(["mode", "exit", "rollouts", "samples/s", "completion tokens/s", "optimizer step (ms, trainer)",
               "wall per optimizer step (ms)", "reward, last 3 rollouts", f"time to {REVERSE.target} (s)"], rows),
        "The time split, milliseconds per rollout (fully_async: per drain) in the steady window:",
        result["phase_table"],
        "Idle, staleness and correction (`fasync bench`'s columns):",
        result["mode_table"],
        "Against the ideal overlap computed from sync's own phases:",
        result["overlap_table"],
    ])
    peak_text = "\n\n".join([
        f"Matmul peak (float32 {MATMUL_SIZE}³, {THREADS} thread, best of about a second), measured before each run "
        f"and after the last: **{fmt(peak, 1)} GFLOP/s** at best, median {fmt(typical, 1)}, over {len(peaks)} "
        f"measurements ({', '.join(fmt(p, 1) for p in peaks)}, in order). \"Of peak\" divides by the best, \"of "
        "median\" by the median (other work on the machine only slows a measurement down). FLOPs as "
        "`fasync.bench.flops` counts them: per sequence of P prompt and C completion tokens, forward "
        f"2 × {shape.body_parameters:,} × (P + C) + 2 × {shape.head_parameters:,} × C + "
        f"{4 * shape.layers * shape.hidden:,} × (P + C)(P + C + 1) / 2; training 3 × that, generation 1 × "
        f"(at P = {fmt(statistics.mean(prompt), 0)}, C = {MAX_NEW_TOKENS}: "
        f"{fmt(shape.train_flops(statistics.mean(prompt), MAX_NEW_TOKENS) / 1e9, 2)} GFLOP to train a sample, "
        f"{fmt(shape.generate_flops(statistics.mean(prompt), MAX_NEW_TOKENS) / 1e9, 2)} to generate it).",
        table(["mode", "train TFLOP", "train s (optimizer steps)", "train GFLOP/s", "of peak", "of median",
               "generate TFLOP", "generate s", "generate GFLOP/s", "of peak", "of median"], fraction_rows),
    ])
    profile = saved["profile"]

    def entries(call: dict) -> str:
        return table(["operator", "calls", "self CPU (ms)", "share"],
                     [[e["name"], e["calls"], fmt(e["self_ms"], 1), f"{e['share']:.1%}"] for e in call["top"]])

    def call_line(name: str, call: dict) -> str:
        rate, running = call["flops"] / call["s"] / 1e9, call["flops"] / call["cpu_s"] / 1e9
        return (f"{name}: {fmt(call['s'], 2)} s unprofiled, of which the process ran {fmt(call['cpu_s'], 2)} s "
                f"(CPU time; {fmt(call['profiled_s'], 2)} s under the profiler), {fmt(call['flops'] / 1e9, 1)} GFLOP: "
                f"{fmt(rate, 1)} GFLOP/s of wall time = {fmt(rate / peak, 2)} of the peak ({fmt(rate / typical, 2)} "
                f"of the median), **{fmt(running, 1)} GFLOP/s of CPU time = {fmt(running / peak, 2)} of the peak** "
                "(what the code reaches while it runs, which the load does not lower as much); "
                f"matrix products ({', '.join(f'`{op}`' for op in MATRIX_OPS)}) took "
                f"{call['matrix_share']:.0%} of the self CPU time ({fmt(call['total_ms'], 0)} ms):")

    appends = profile["generate"]
    profile_text = "\n\n".join([
        f"In this process, {profile['threads']} thread, no other actor running: one generate call of "
        f"{profile['samples']} samples ({PROMPTS} prompts × {SAMPLES}, prompts of "
        f"{fmt(profile['prompt_tokens'], 0)} tokens, {fmt(profile['completion_tokens'], 1)} new tokens on average) "
        "and one optimizer step on them, each after an unprofiled warm-up call; the top entries by self CPU time.",
        call_line("Generate call", profile["generate"]), phases_line(profile, peak), entries(profile["generate"]),
        f"Timed without the profiler in another call ({fmt(appends['appends_call_s'], 2)} s), the KV cache "
        f"({', '.join(f'`{name}`' for name in appends.get('cache_layers', ['DynamicLayer']))} per layer) spent "
        f"{fmt(appends['cache_append_s'], 2)} s ({appends['cache_append_s'] / appends['appends_call_s']:.0%}) "
        "storing each forward's keys and values (`Cache.update`): the profiler's own overhead inflates its small "
        "operators' entries above.",
        vllm_line(saved.get("vllm"), shape, peak),
        call_line("Optimizer step", profile["step"]), entries(profile["step"]),
    ])
    return {"medium-setup": setup, "medium-modes": modes, "medium-peak": peak_text, "medium-profile": profile_text}


def phases_line(profile: dict, peak: float) -> str:
    call = profile["generate"]
    if "prefill_cpu_s" not in call:
        return "The call's prefill and decode steps were not timed apart."
    rates = generate_phases(call)
    return (f"Of its CPU time, the prefill (one forward over the {PROMPTS} distinct prompts, left-padded, whose keys, "
            f"values and logits their {profile['samples'] // PROMPTS} samples each share) took "
            f"{fmt(call['prefill_cpu_s'], 2)} s for {fmt(call['prefill_flops'] / 1e9, 1)} GFLOP: "
            f"**{fmt(rates['prefill'] / peak, 2)} of the peak**; the decode steps took "
            f"{fmt(call['cpu_s'] - call['prefill_cpu_s'], 2)} s for "
            f"{fmt(call['decode_flops'] / 1e9, 1)} GFLOP: **{fmt(rates['decode'] / peak, 2)} of the "
            f"peak**. The decoder's linear products alone on {profile['samples']} rows, every layer's weights in turn "
            f"as a decode step reads them, ran at {fmt(rates['decode_products'], 1)} GFLOP/s per CPU second = "
            f"{fmt(rates['decode_products'] / peak, 2)} of the peak: a ceiling for decode steps of this many rows, "
            "whose counted FLOPs are nearly all these products.")


def vllm_line(vllm: dict | None, shape: LlamaShape, peak: float) -> str:
    if vllm is None:
        return "vLLM's CPU engine on the same call: not measured (run with `--vllm-python .venv-vllm/bin/python`)."
    if "error" in vllm:
        return f"vLLM's CPU engine on the same call failed: `{vllm['error'].strip().splitlines()[-1]}`."
    calls = [shape.generate_flops(p, c) * vllm["samples"] for p, c in zip(vllm["prompt_tokens"], vllm["completion_tokens"])]
    wall = [f / s / 1e9 for f, s in zip(calls, vllm["s"])]
    cpu = [f / s / 1e9 for f, s in zip(calls, vllm["cpu_s"])]
    return (f"vLLM {vllm['vllm']}'s CPU engine (`rollout.engine=vllm`, in a process of its own, "
            f"`OMP_NUM_THREADS=1`, torch on {vllm['threads']} thread) on the same call, after a warm-up call, "
            f"{len(calls)} calls: {spread(vllm['s'], 2)} s each, of which the process ran {spread(vllm['cpu_s'], 2)} s "
            f"(CPU time, all its threads), {spread(vllm['completion_tokens'], 1)} new tokens on average: "
            f"{spread(wall, 1)} GFLOP/s of wall time = {fmt(statistics.median(wall) / peak, 2)} of the peak, "
            f"**{spread(cpu, 1)} GFLOP/s of CPU time = {fmt(statistics.median(cpu) / peak, 2)} of the peak**.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=6, help="Most rollouts per mode.")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--top", type=int, default=TOP, help="Profile entries shown per call.")
    parser.add_argument("--out", type=Path, default=None, help="Keep the runs here (default: a temporary folder).")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/benchmarks.md alone.")
    parser.add_argument("--render", type=Path, default=None,
                        help="Only render the blocks from the results.json an earlier run left in its --out.")
    parser.add_argument("--vllm-python", default=None,
                        help="A Python with vLLM's CPU build (`make venv-vllm`: .venv-vllm/bin/python): the profiled "
                        "generate call is also timed on vLLM's engine. Default: not measured.")
    parser.add_argument("--profile-only", action="store_true",
                        help="Only the peak and the profiled calls, without the mode runs: print their figures as one "
                        "JSON line and leave docs/benchmarks.md alone.")
    parser.add_argument("--vllm-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_child is not None:
        print(json.dumps(vllm_generate(args.vllm_child)))
        return 0
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        return write(render(saved, saved["measured"]), args.no_write)

    import torch

    from fasync.commands.train import run as train

    torch.set_num_threads(THREADS)
    command = measured(sys.argv)
    load_before = list(os.getloadavg())
    capacity = parallel_capacity()
    with tempfile.TemporaryDirectory(prefix="fasync-medium-") as scratch:
        out = args.out or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        files = write_files(out, args.rollouts)
        model, rows = files.model, files.rows()
        prompt_tokens, answer_tokens = token_lengths(model, rows)
        config_json = json.loads((model / "config.json").read_text())
        shape = LlamaShape.of(config_json)
        from transformers import AutoModelForCausalLM

        parameters = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())
        config = files.config
        peaks = [matmul_peak(MATMUL_SIZE)]
        print(f"medium: peak {peaks[-1]:.1f} GFLOP/s; profiling", flush=True)
        profile = profile_calls(config, rows, shape, args.top)
        print(f"medium: generate {profile['generate']['s']:.2f} s, step {profile['step']['s']:.2f} s", flush=True)
        if args.profile_only:
            peaks.append(matmul_peak(MATMUL_SIZE))
            print(json.dumps(profile_fractions(profile, peaks)))
            return 0
        vllm = run_vllm(args.vllm_python, out) if args.vllm_python else None
        if vllm is not None:
            print(f"medium: vLLM {vllm}", flush=True)

        def measure_peak(variant: Variant) -> None:
            peaks.append(matmul_peak(MATMUL_SIZE))
            print(f"medium: peak {peaks[-1]:.1f} GFLOP/s before {variant.label}", flush=True)

        scenario = Scenario("medium", "The medium shape in each mode.", tuple(Variant(m, m) for m in args.modes),
                            reference=args.modes[0])
        result: ScenarioResult = run_scenario(train, scenario, str(config), [], out, REVERSE.target, ROOT / "configs",
                                              before_each=measure_peak)
        peaks.append(matmul_peak(MATMUL_SIZE))
        prompt_mean = statistics.mean(prompt_tokens)
        rates, rewards = {}, {}
        for label, run_dirs in result.run_dirs.items():
            records, _ = read_run_dir(run_dirs[0])
            rates[label] = phase_rates(records, shape, prompt_mean)
            rewards[label] = reward_reached(records)
        saved = {
            "measured": command, "shape": shape.__dict__, "parameters": parameters, "peaks": peaks, "load_before": load_before,
            "load_after": load_average(), "capacity": capacity, "rollouts": args.rollouts,
            "prompt_tokens": prompt_tokens, "answer_tokens": answer_tokens, "profile": profile, "vllm": vllm,
            "result": {"reports": {label: r.as_dict() for label, r in result.by_label().items()}, "rates": rates,
                       "rewards": rewards, "phase_table": phase_table(result), "mode_table": mode_table(result),
                       "overlap_table": overlap_table(result) if "sync" in args.modes else "(sync not run)"},
        }
        (out / "results.json").write_text(json.dumps(saved, indent=1))
    return write(render(saved, command), args.no_write)


def write(blocks: dict[str, str], dry: bool) -> int:
    for name, text in blocks.items():
        print(f"\n## {name}\n\n{text}")
        if not dry:
            write_block(DOC, name, text, "`python bench/medium_shape.py`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
