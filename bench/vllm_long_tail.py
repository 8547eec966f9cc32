"""The long-tail scenario with the vLLM engine: fully_async, whose rollouter streams requests into vLLM (continuous
batching), against async, which hands vLLM one closed batch per rollout; fully_async with each way a weight sync
treats the requests in flight. vLLM's CPU build, on a tiny Llama; with `--shape medium`, the same comparison of a
sync's two ways (abort, kept KV) at the medium shape (fasync.bench.medium), where a prefill costs more.

    .venv-vllm/bin/python bench/vllm_long_tail.py [--shape long-tail|medium] [--repeats N] [--rollouts N]
                                                  [--warm-start STEPS] [--lr LR] [--out DIR] [--no-write]

The data and the reward are `fasync bench`'s long-tail scenario (fasync.bench.modes.LONG_TAIL): 10% of the prompts
need 24-digit answers, the others 2-digit ones. The model is first fine-tuned on the answers (`warm_start`), so
that lengths follow the data in every run instead of depending on when each run's policy learns to stop. Each
mode takes its `async` and `correction` sections from the repository's example configs, as `fasync bench` does,
and the runs go round the variants in turn, `--repeats` times. Writes its block of docs/benchmarks.md
(`vllm-long-tail`, or `vllm-medium`) unless `--no-write`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from fasync.bench import medium
from fasync.bench.modes import LONG_TAIL, Scenario, Variant, read_run_dir, run_scenario
from fasync.bench.report import (
    comparison,
    load_average,
    load_sentence,
    measured,
    mode_table,
    overrides_list,
    parallel_capacity,
    phase_table,
    write_block,
)
from fasync.bench.warm_start import fine_tune
from fasync.commands.train import run as train
from fasync.config.derived import derive
from fasync.config.loader import load_config
from fasync.report.markdown import fmt, table
from fasync.staleness import max_lag

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "configs"
LENGTH_WINDOW = 5
"""Rollouts averaged at each end of a run for the completion-length column."""
STEP_ROWS = (1, 8, 64, 128)
"""Batches of requests whose decode steps `decode_step_costs` times, `STEP_COUNT` steps each, best of `STEP_ATTEMPTS`."""
STEP_COUNT = 20
STEP_ATTEMPTS = 3
WARM_START_LR = 3e-3
WARM_START_BATCH = 64
LOSS_WINDOW = 100
WIDE_IN_FLIGHT = 128
"""Requests in the engine at once in the streamed variants with a sync every `SYNC_EVERY` drains
(`async.max_concurrent_samples`), two rollouts' worth: a decode step costs mostly its fixed part at this size, so a
step that serves more requests costs less per token."""
SYNC_EVERY = 2
"""The sync interval of the variants that compare async and streamed fully_async at the same worst lag: a sync every
2 drains halves the weight loads, and each bound b then lags by (b + 1) × 2 − 1 optimizer steps in either mode."""
EQUAL_LAG_BOUNDS = (1, 2)
"""The staleness bounds at which both modes run with a sync every `SYNC_EVERY` drains."""


def write_model(directory: Path) -> Path:
    """The tests' tiny Llama for vLLM (tests/tiny_models.py), 128 wide with two heads of 64 (a head size vLLM's CPU
    attention supports)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import write_vllm_llama

    write_vllm_llama(directory)
    return directory


def warm_start(directory: Path, dataset: Path, steps: int) -> list[float]:
    """Fine-tunes the model in `directory` in place on the dataset's answers (`fasync.bench.warm_start.fine_tune`)
    and returns the loss of every `LOSS_WINDOW` steps. From random weights every completion runs to the token
    budget until the policy learns to stop, and when it learns that differs from run to run: the lengths, hence the
    throughput, would measure the learning rather than the scheduling. After this the completions' lengths follow
    the data from the first rollout, as a supervised model's do."""
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    return fine_tune(directory, [(row["prompt"], row["label"]) for row in rows], steps, lr=WARM_START_LR,
                     batch=WARM_START_BATCH, loss_every=LOSS_WINDOW)


def answer_lengths(directory: Path, dataset: Path, length: int, count: int = 8) -> list[int | None]:
    """The greedy completions of the model in `directory` to the first `count` prompts whose answers are `length`
    digits: the tokens each takes before `</s>` (None: no `</s>` within twice the length)."""
    import torch
    import transformers

    from fasync.model.tokenizer import HFTokenizer

    tokenizer, model = HFTokenizer(str(directory)), transformers.LlamaForCausalLM.from_pretrained(directory)
    rows = [row for row in map(json.loads, dataset.read_text().splitlines()) if len(row["label"]) == length][:count]
    found = []
    for row in rows:
        prompt = torch.tensor([tokenizer.format_prompt(row["prompt"])])
        completion = model.generate(prompt, max_new_tokens=2 * length, do_sample=False,
                                    pad_token_id=tokenizer.pad_id)[0, prompt.shape[1]:].tolist()
        found.append(completion.index(tokenizer.eos_id) if tokenizer.eos_id in completion else None)
    return found


def decode_step_costs(config: Path, rows: tuple[int, ...] = STEP_ROWS) -> dict[int, float]:
    """Milliseconds per decode step of vLLM's engine on the runs' model, at each batch of `rows` requests, in this
    process on one thread, built as the runs build theirs (`VLLMEngine`): what a step costs beyond its rows is what
    a closed batch pays again for every step of its tail, which streaming shares among more requests."""
    import time

    from fasync.config.loader import load_config
    from fasync.rollout.vllm_engine import VLLMEngine

    os.environ["OMP_NUM_THREADS"] = "1"
    engine = VLLMEngine(load_config(config, ["resources.rollout_threads=1"]).config).llm.llm_engine
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=STEP_COUNT + 1, ignore_eos=True, logprobs=0, detokenize=False)
    costs = {}
    for count in rows:
        best = float("inf")
        for attempt in range(STEP_ATTEMPTS):  # the best: other work on the machine only slows a step down
            for index in range(count):
                engine.add_request(f"{count}-{attempt}-{index}", TokensPrompt(prompt_token_ids=[1, 5 + index % 10]),
                                   params)
            engine.step()  # the prefill
            started, taken = time.perf_counter(), 0
            while engine.has_unfinished_requests():
                engine.step()
                taken += 1
            best = min(best, (time.perf_counter() - started) / taken)
        costs[count] = 1000 * best
    return costs


def step_cost_line(costs: dict[int, float]) -> str:
    fewest, most = min(costs), max(costs)
    per_row = (costs[most] - costs[fewest]) / (most - fewest)
    return (f"vLLM's decode step on this model, one thread, best of {STEP_ATTEMPTS} batches of {STEP_COUNT} steps: "
            + ", ".join(f"{costs[rows]:.2f} ms at {rows} requests" for rows in sorted(costs))
            + f"; about {costs[fewest] - fewest * per_row:.2f} ms per step and {per_row:.3f} ms per request in it.")


SYNC_WAYS = (
    Variant("async", "async"),
    Variant("fully_async (partial rollout, streamed)", "fully_async", ("async.partial_rollout=true",)),
    Variant("fully_async (partial rollout, kept KV, streamed)", "fully_async",
            ("async.partial_rollout=true", "async.pause_mode=keep")),
)
"""async, and streamed fully_async with each way a weight sync treats the requests in flight (abort, kept KV): the
variants of both shapes."""


def equal_lags() -> str:
    """The worst lag at each of `EQUAL_LAG_BOUNDS` with a sync every `SYNC_EVERY` drains, for the description."""
    first, *rest = ((max_lag("async", bound, 1, SYNC_EVERY).steps, bound) for bound in EQUAL_LAG_BOUNDS)
    return ", ".join([f"{first[0]} optimizer steps with a staleness bound of {first[1]}",
                      *(f"at {steps} with a bound of {bound}" for steps, bound in rest)])


def every_other_async(bound: int) -> Variant:
    """async with a sync every `SYNC_EVERY` drains at staleness bound `bound`."""
    return Variant(f"async (bound {bound}, a sync every {SYNC_EVERY} drains)", "async",
                   (f"async.max_weight_staleness={bound}", f"async.update_weights_interval={SYNC_EVERY}"))


def every_other_streamed(bound: int) -> Variant:
    """Streamed fully_async at the same lag as `every_other_async(bound)`: kept KV, waiting for late groups, and
    `WIDE_IN_FLIGHT` requests in the engine."""
    return Variant(f"fully_async (partial rollout, kept KV, waits for late groups, bound {bound}, a sync every "
                   f"{SYNC_EVERY} drains, {WIDE_IN_FLIGHT} in flight, streamed)", "fully_async",
                   ("async.partial_rollout=true", "async.pause_mode=keep", "async.stale_policy=wait",
                    f"async.max_weight_staleness={bound}", f"async.update_weights_interval={SYNC_EVERY}",
                    f"async.max_concurrent_samples={WIDE_IN_FLIGHT}"))


def base_config(path: Path, model: Path, dataset: Path, rollouts: int, lr: float) -> Path:
    config = {
        "model": {"path": str(model)},
        "data": {"path": str(dataset), "task": None},
        "reward": {"function": "fasync.bench.rewards:length_then_digits"},
        "rollout": {"engine": "vllm", "batch_size": 8, "n_samples_per_prompt": 8,
                    "max_new_tokens": LONG_TAIL.long},
        "train": {"global_batch_size": 64, "micro_batch_size": LONG_TAIL.micro_batch_size, "num_rollouts": rollouts,
                  "target_reward": None, "lr": lr},
        "logging": {"progress": "none"},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def scenario(dataset: Path, rollouts: int) -> Scenario:
    return Scenario(
        "vllm-long-tail",
        f"The long-tail data of `fasync bench` ({LONG_TAIL.long_fraction:.0%} of the prompts need {LONG_TAIL.long}-"
        f"digit answers, the others {LONG_TAIL.short}-digit ones, `{dataset.name}`; reward "
        "`fasync.bench.rewards:length_then_digits`), generated by vLLM's CPU build on the tests' tiny Llama (2 layers, "
        f"128 wide), 8 prompts × 8 samples per rollout (drain), {rollouts} of them per run. async hands vLLM one "
        "closed batch per rollout, which lasts as long as its longest completion; fully_async submits each group's "
        "requests as admission lets it in and a group leaves for the queue as soon as its last completion ends. At a "
        "weight sync, partial rollout aborts the requests in flight and submits them again from their prefix (a new "
        "prefill), kept KV (`async.pause_mode: keep`) pauses the engine with them and their KV cache in it, and "
        "without partial rollout they finish under the old weights first. Waiting for late groups "
        "(`async.stale_policy: wait`) makes a drain wait for a group still generating that the next drain would "
        f"drop as stale. A sync every {SYNC_EVERY} drains (`async.update_weights_interval: {SYNC_EVERY}`) halves the "
        f"weight loads, and bounds the lag at {equal_lags()}, in both modes; "
        f"`async.max_concurrent_samples: {WIDE_IN_FLIGHT}` lets the rollouter keep two rollouts' requests in the "
        "engine at once.",
        (
            SYNC_WAYS[0],
            *(every_other_async(bound) for bound in EQUAL_LAG_BOUNDS),
            *SYNC_WAYS[1:],
            *(every_other_streamed(bound) for bound in EQUAL_LAG_BOUNDS),
            Variant("fully_async (no partial rollout, streamed)", "fully_async", ("async.partial_rollout=false",)),
        ),
        reference="async",
        overrides=("train.target_reward=null",),  # every run trains all its rollouts
        target=LONG_TAIL.target,
    )


def medium_scenario(rollouts: int) -> Scenario:
    return Scenario(
        "vllm-medium",
        f"The medium shape (fasync.bench.medium: a 26 M-parameter Llama, the {medium.WORDS_PER_PROMPT}-word reverse "
        f"task, {medium.PROMPTS} prompts × {medium.SAMPLES} samples per rollout, at most {medium.MAX_NEW_TOKENS} new "
        f"tokens) generated by vLLM's CPU build from the model's random weights, {rollouts} rollouts per run: every "
        "completion runs to the token budget, so there is no tail, and what differs is how a weight sync treats the "
        "requests in flight. A prefill here is the prompt's tokens and the completion's so far through 8 layers, "
        "which partial rollout pays again for every request a sync aborts and kept KV does not.",
        SYNC_WAYS,
        reference="async",
        overrides=("rollout.engine=vllm", "train.target_reward=null"),
        target=medium.REVERSE.target,
    )


def interruptions(result) -> str:
    """What the weight syncs did to the requests in flight, per drain of each variant's first run: the groups a
    sync interrupted that went on from their prefix, and the seconds generation was paused for the syncs."""
    rows = []
    for variant in result.scenario.variants:
        records, _ = read_run_dir(result.run_dirs[variant.label][0])
        drains = max(len({r["rollout"] for r in records}), 1)
        resumed = max((r.get("resumed_groups") or 0 for r in records), default=0)
        paused = sum(r.get("rollouter_pause_s") or 0.0 for r in records)
        rows.append([variant.label, fmt(resumed / drains, 2), fmt(1000 * paused / drains, 1)]
                    if variant.mode == "fully_async" else [variant.label, "—", "—"])
    return table(["mode", "groups resumed from their prefix, per drain", "generation paused per drain (ms)"], rows)


def rounds(result) -> str:
    """Each variant's samples/s in each round, over the reference's in the same round (the variants run in turn, so
    a round's runs share the machine's state, which drifts between rounds), with its worst lag in optimizer steps:
    the bound's, (s + 1) × I × N − 1 (`fasync.staleness.max_lag`), and the most any of its runs trained on
    (`policy_lag_max`)."""
    reports, reference = result.by_label(), result.scenario.reference
    base = reports[reference].runs_samples_per_s
    rows = []
    for variant in result.scenario.variants:
        dirs = result.run_dirs[variant.label]
        worst_lag = derive(load_config(dirs[0] / "config.yaml").config).max_lag.steps
        trained = max((r.get("policy_lag_max") or 0 for d in dirs for r in read_run_dir(d)[0]), default=0)
        runs = reports[variant.label].runs_samples_per_s
        rows.append([variant.label, worst_lag, trained, *(f"{fmt(rate, 0)} ({fmt(rate / ref, 2)}×)"
                                                      for rate, ref in zip(runs, base))])
    return table(["mode", "worst lag (optimizer steps)", "most lag trained on",
                  *(f"round {index + 1}: samples/s (× {reference})" for index in range(len(base)))], rows)


def lengths(result) -> str:
    """Mean completion length at the start and the end of each variant's first run: whether the model learned to
    stop short answers, which is what makes the tail (until then every completion runs to the budget)."""
    rows = []
    for variant in result.scenario.variants:
        records, _ = read_run_dir(result.run_dirs[variant.label][0])
        series = [r["response_length_mean"] for r in records if "response_length_mean" in r]
        ends = [statistics.mean(part) if part else None
                for part in (series[:LENGTH_WINDOW], series[-LENGTH_WINDOW:])]
        rows.append([variant.label, *(fmt(value, 1) for value in ends)])
    return table(["mode", f"tokens per completion, first {LENGTH_WINDOW} steps",
                  f"last {LENGTH_WINDOW} steps"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("long-tail", "medium"), default="long-tail")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rollouts", type=int, default=40)
    parser.add_argument("--warm-start", type=int, default=600, metavar="STEPS",
                        help="Supervised steps on the answers before the runs (0: start from random weights).")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", type=Path, help="Where the runs go (default: a temporary directory).")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/benchmarks.md alone.")
    args = parser.parse_args()

    load_before, capacity = list(os.getloadavg()), parallel_capacity()
    out = args.out or Path(tempfile.mkdtemp(prefix=f"fasync-bench-vllm-{args.shape}-"))
    if args.shape == "medium":
        config = medium.write_files(out, args.rollouts).config
        chosen, names = medium_scenario(args.rollouts), {str(out): "DIR"}
        warm = f"Every run starts from the model's random weights and trains at lr {medium.REVERSE.lr}."
    else:
        model = write_model(out / "model")
        dataset = LONG_TAIL.write_dataset(out / "long-tail.jsonl")
        losses = warm_start(model, dataset, args.warm_start) if args.warm_start else []
        if args.warm_start and set(found := answer_lengths(model, dataset, LONG_TAIL.short)) != {LONG_TAIL.short}:
            # The lengths would measure when each run learns to stop, not the scheduling: nothing to publish.
            print(f"the warm start did not teach the model to stop after {LONG_TAIL.short}-digit answers (greedy "
                  f"answers of {found} tokens; losses {losses}): raise --warm-start", file=sys.stderr)
            return 1
        config = base_config(out / "base.yaml", model, dataset, args.rollouts, args.lr)
        chosen, names = scenario(dataset, args.rollouts), {str(dataset): dataset.name, str(model): "tiny-llama"}
        warm = long_tail_start(args, losses)
    result = run_scenario(train, chosen, str(config), [], out, chosen.target, EXAMPLES, repeats=args.repeats)
    costs = decode_step_costs(config)
    import vllm

    text = "\n\n".join([
        f"{measured(sys.argv)}; vLLM {vllm.__version__} (CPU build, eager, in-process engine core), one engine, one "
        f"thread each for generation and training, medians of {args.repeats} runs per variant taken in turn "
        f"(range in brackets); {load_sentence(load_before, load_average(), capacity)}.",
        chosen.description,
        warm,
        step_cost_line(costs),
        overrides_list(result, EXAMPLES, names),
        mode_table(result),
        "Milliseconds per rollout (drain):",
        phase_table(result),
        "The weight syncs and the requests in flight (first run of each variant):",
        interruptions(result),
        comparison(result),
        "Round by round (the variants in turn, each round's runs one after another):",
        rounds(result),
        "Completion lengths (first run of each variant):",
        lengths(result),
    ])
    print(text)
    if not args.no_write:
        write_block(ROOT / "docs" / "benchmarks.md", chosen.name, text, "`python bench/vllm_long_tail.py`")
    return 0 if all(report.exit_code == 0 for report in result.reports) else 1


def long_tail_start(args, losses: list[float]) -> str:
    return (f"Before the runs the model was fine-tuned for {args.warm_start} supervised steps ({WARM_START_BATCH} "
            f"answers each, followed by `</s>`, AdamW at {WARM_START_LR}; loss every {LOSS_WINDOW} steps: "
            f"{', '.join(f'{loss:.2f}' for loss in losses)}), so that its completions' lengths follow the data from "
            f"the first rollout; every run starts from those weights and trains at lr {args.lr}."
            if args.warm_start else f"Every run starts from random weights and trains at lr {args.lr}.")


if __name__ == "__main__":
    sys.exit(main())
