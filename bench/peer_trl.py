"""fasync against TRL's GRPOTrainer on the same work, at one of three shapes (`--shape`):

- small (the default): the quickstart task and reward, one tiny Hugging Face model written here in code, 32 prompts
  × 8 samples per step, lr 2e-3, 6 new tokens, one torch thread;
- medium: the medium shape of bench/medium_shape.py (`fasync.bench.medium`: a 26 M-parameter Llama with a BPE
  tokenizer and a chat template, the 64-word reverse task), 4 prompts × 4 samples per step, lr 3e-4, at most 80 new
  tokens, one torch thread: speed per step, as no run learns that task;
- medium-target: the same shape on the task a run learns, for time to a target (`fasync.bench.medium.CONTINUE`:
  the model fine-tuned first on two answers to every prompt, the reward counting one), lr 5e-5, target 0.7.

    make venv-peer                                   # .venv-peer: torch, fasync and the `peer` extra (trl)
    .venv-peer/bin/python bench/peer_trl.py [--shape medium|medium-target] [--repeat 2] [--steps 400] [--no-write]

Runs TRL, then fasync sync, async and fully_async, in turn, `--repeat` times (interleaved, so that a machine
that slows down for a while slows every side alike). Each run is a fresh Python process, timed and watched
from here: time to its first optimizer step and to the target reward (from the process's start, imports
included), its own per-step times, and its peak memory as PSS summed over the process and everything it
started (Ray's processes and actors included). Writes the table into docs/benchmarks.md (the small shape's in
section Against TRL, the medium shape's two in section A medium shape), with both sides' settings, as ratios to
TRL.
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
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fasync.bench import medium  # noqa: E402
from fasync.bench.llama import SPECIALS, save_llama  # noqa: E402
from fasync.bench.modes import COMMON  # noqa: E402
from fasync.bench.report import (  # noqa: E402
    fmt,
    load_average,
    load_sentence,
    measured,
    parallel_capacity,
    spread,
    table,
    write_block,
)
from fasync.bench.timing import timed_method  # noqa: E402
from fasync.metrics.measure import REWARD_WINDOW  # noqa: E402
from fasync.model.tokenizer import TASK_ALPHABET  # noqa: E402
from fasync.modes import MODES  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
SIDES = ("trl", *MODES)
FASYNC_COMMON = (*COMMON, "train.micro_batch_size=256", "train.global_batch_size=256")
"""On top of configs/quickstart.yaml (32 prompts × 8 samples, lr 2e-3, 6 new tokens, target 0.9)."""
MODEL = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 4, "max_position_embeddings": 32}


def write_model(directory: Path, seed: int = 0) -> Path:
    """A 2-layer, 64-wide Llama and a character-level tokenizer over the task's alphabet, without a chat
    template, so that both sides feed the model the prompt's characters and nothing else."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(SPECIALS + list(TASK_ALPHABET))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return save_llama(directory, core, MODEL, seed)


# -- the shapes -------------------------------------------------------------------------------------


def small_files(out: Path, steps: int) -> Path:
    return write_model(out / "model")


def small_prompts(model: Path, seed: int) -> tuple[list[dict], Callable[[str, str], float]]:
    from fasync.data.rewards import partial_match
    from fasync.data.tasks import generate_problems

    # The quickstart's pool: data.task reverse, data.length 6, data.num_prompts 4096, data.seed.
    return [{"prompt": p.prompt, "label": p.label} for p in generate_problems("reverse", 6, 4096, seed)], partial_match


def small_fasync(model: Path) -> tuple[Path, list[str]]:
    return ROOT / "configs" / "quickstart.yaml", [*FASYNC_COMMON, f"model.path={model}"]


def medium_files(task: medium.Task, out: Path, steps: int) -> Path:
    return medium.write_files(out, steps, task).model


def medium_prompts(task: medium.Task, model: Path, seed: int) -> tuple[list[dict], Callable[[str, str], float]]:
    """The pool fasync reads (`data.path`), each prompt as a user's message: TRL renders it through the chat
    template as fasync does."""
    return [{"prompt": [{"role": "user", "content": row["prompt"]}], "label": row["label"]}
            for row in medium.MediumFiles(model.parent, task).rows()], task.reward


def medium_fasync(task: medium.Task, model: Path) -> tuple[Path, list[str]]:
    return medium.MediumFiles(model.parent, task).config, list(COMMON)


@dataclass(frozen=True)
class Shape:
    """The work both sides do at one shape: per optimizer step `prompts` × `samples` samples of at most
    `new_tokens` tokens at temperature 1, lr `lr`, runs stopping at a 3-step mean reward of `target`.
    `write_files(out, steps)`: the model's directory both sides load, and what else the shape reads beside it;
    `trl_prompts(model, seed)`: TRL's rows (`prompt`, `label`) and the reward of a completion's text and its
    label; `fasync_run(model)`: the config `fasync train` loads and the overrides every mode adds to it. `block`:
    the block of docs/benchmarks.md it writes; `goals`: (what, side, key, the most that the side's median over
    TRL's may be)."""

    name: str
    prompts: int
    samples: int
    new_tokens: int
    lr: float
    target: float
    write_files: Callable[[Path, int], Path]
    trl_prompts: Callable[[Path, int], tuple[list[dict], Callable[[str, str], float]]]
    fasync_run: Callable[[Path], tuple[Path, list[str]]]
    block: str
    goals: tuple[tuple[str, str, str, float], ...]


SMALL = Shape("small", 32, 8, 6, 2e-3, 0.9, small_files, small_prompts, small_fasync, "peer-trl", (
    ("fasync sync per step ≤ TRL's", "sync", "step_ms", 1.0),
    ("fasync sync time to {target} ≤ TRL's", "sync", "time_to_target_s", 1.0),
    ("fully_async ≥ 1.4× faster than TRL to {target}", "fully_async", "time_to_target_s", 1 / 1.4),
))
"""The quickstart's: configs/quickstart.yaml, its task and reward, `write_model`'s Llama."""


MEDIUM_GOALS = (
    ("fasync sync ≥ 1.2× TRL's speed per step", "sync", "step_ms", 1 / 1.2),
    ("fully_async ≥ 2× faster than TRL to {target}", "fully_async", "time_to_target_s", 0.5),
)
"""Issue 31 §2's, at either medium shape."""


def medium_shape(name: str, task: medium.Task) -> Shape:
    """The medium shape on `task`, with `MEDIUM_GOALS`, writing its block `peer-trl-NAME`."""
    return Shape(name, medium.PROMPTS, medium.SAMPLES, medium.MAX_NEW_TOKENS, task.lr, task.target,
                 partial(medium_files, task), partial(medium_prompts, task), partial(medium_fasync, task),
                 f"peer-trl-{name}", MEDIUM_GOALS)


MEDIUM = medium_shape("medium", medium.REVERSE)
"""bench/medium_shape.py's (issue 31 §2): the files `fasync.bench.medium.write_files` writes for its throughput task,
which both sides load."""
MEDIUM_TARGET = medium_shape("medium-target", medium.CONTINUE)
"""The same shape on the task a run learns (`fasync.bench.medium.CONTINUE`, warm-started): time to a target."""
SHAPES = {shape.name: shape for shape in (SMALL, MEDIUM, MEDIUM_TARGET)}


# -- the two sides, each run as a child process ------------------------------------------------------


def trl_settings(shape: Shape, out: Path, steps: int, seed: int) -> dict:
    return dict(output_dir=str(out / "trl"), per_device_train_batch_size=shape.prompts * shape.samples,
                num_generations=shape.samples, max_completion_length=shape.new_tokens, learning_rate=shape.lr,
                lr_scheduler_type="constant", temperature=1.0, beta=0.0, num_iterations=1, loss_type="dapo",
                scale_rewards="group", epsilon=0.2, max_grad_norm=1.0, weight_decay=0.0, max_steps=steps,
                logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
                disable_dropout=True, seed=seed, dataloader_num_workers=0)


def run_trl(shape: Shape, model: Path, out: Path, steps: int, seed: int) -> None:
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows, score = shape.trl_prompts(model, seed)
    dataset = Dataset.from_list(rows)

    def reward(completions, label, **_):
        # A conversational prompt's completion is the assistant's message.
        return [score(completion if isinstance(completion, str) else completion[-1]["content"], answer)
                for completion, answer in zip(completions, label)]

    steps_file = (out / "steps.jsonl").open("w")
    rewards: list[float] = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "reward" not in logs:
                return
            rewards.append(logs["reward"])
            steps_file.write(json.dumps({"step": state.global_step, "time": time.time(), "reward": logs["reward"],
                                         "generate_time_s": generating[0]}) + "\n")
            steps_file.flush()
            generating[0] = 0.0
            if len(rewards) >= REWARD_WINDOW and statistics.mean(rewards[-REWARD_WINDOW:]) >= shape.target:
                control.should_training_stop = True

    tokenizer = AutoTokenizer.from_pretrained(model)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32),
                          reward_funcs=reward, args=GRPOConfig(**trl_settings(shape, out, steps, seed)),
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[Record()])
    # TRL's generation (its prompts through the template, transformers' `generate`, the completions' ids), timed
    # for the step's record as fasync's engines time theirs.
    with timed_method(trainer, "_generate") as generating:
        trainer.train()


def fasync_overrides(mode: str, model: Path, steps: int, seed: int, shape: Shape = SMALL) -> list[str]:
    from fasync.bench.modes import mode_overrides

    _, common = shape.fasync_run(model)
    return [*mode_overrides(mode, ROOT / "configs"), *common, f"train.num_rollouts={steps}",
            f"train.target_reward={shape.target}", f"train.seed={seed}", f"data.seed={seed}"]


def run_fasync(shape: Shape, mode: str, model: Path, out: Path, steps: int, seed: int) -> int:
    from fasync.commands.train import run as train

    config, _ = shape.fasync_run(model)
    code = train(str(config), fasync_overrides(mode, model, steps, seed, shape), run_dir=str(out / "run"))
    # Which heavy modules the driver process itself loaded (its PSS at the peak is in the table).
    print("driver modules:", {name: name in sys.modules for name in ("torch", "transformers", "numpy")}, flush=True)
    return code


def run_ray_alone(out: Path) -> None:
    """Start Ray as `fasync train` does for the quickstart, idle a few seconds, stop: Ray's own share of
    fasync's start-up and memory."""
    from fasync.commands.train import start_ray
    from fasync.config.loader import load_config
    from fasync.launch.plan import resolve

    cfg = load_config(str(ROOT / "configs" / "quickstart.yaml"), []).config
    started = time.monotonic()
    start_ray(cfg, resolve(cfg).plan)
    (out / "ready").write_text(f"{time.monotonic() - started:.3f}")
    time.sleep(3)


# -- watching a child ------------------------------------------------------------------------------


def process_name(pid: int) -> str:
    """What a process is, briefly: Ray's title for its own processes (`ray::TrainerActor`), else the program
    (for Python, the script or module it runs)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0].split(".")[0].split()[0]
    program = Path(words[0]).name
    if program.startswith("python"):
        if "-m" in words[1:-1]:
            return f"python -m {words[words.index('-m') + 1]}"
        if "-c" in words:
            return "python -c"
        scripts = [w for w in words[1:] if not w.startswith("-")]
        return f"python {Path(scripts[0]).name}" if scripts else "python"
    return program


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command's name (the first is the state, the second the parent's pid)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_tree(root: int) -> list[int]:
    """`root` and every living process descended from it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = stat_fields(int(entry))
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack += children.get(pid, [])
    return tree


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user and system) that `root` and its living descendants have run, with those of their children
    that ended and were waited for: the work a side did, which other work on the machine delays but does not
    add to."""
    ticks = 0
    for pid in process_tree(root):
        try:
            # utime, stime, cutime, cstime
            ticks += sum(int(field) for field in stat_fields(pid)[11:15])
        except OSError:
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def tree_pss(root: int) -> tuple[int, dict[str, int], int]:
    """PSS in bytes of `root` and every process descended from it: the total, by `process_name`, and how many
    processes there are."""
    total, by_name, count = 0, {}, 0
    for pid in process_tree(root):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    size = int(line.split()[1]) * 1024
                    total += size
                    count += 1
                    name = process_name(pid)
                    by_name[name] = by_name.get(name, 0) + size
                    break
        except OSError:
            continue
    return total, by_name, count


def step_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


SAMPLE_EVERY = 0.1
"""Seconds between two samples of a side's memory, at the most often."""
WATCH_SHARE = 0.05
"""The share of one core that sampling a side's memory may take. Reading the smaps_rollup of processes that map
gigabytes takes tens of milliseconds: sampled every 0.1 s, that took 0.4 of a core (2026-12-07, the medium shape),
from the two cores a fasync side overlaps its work on, and from the core TRL leaves idle."""


class PeakMemory:
    """The peak of `tree_pss` over a side's run, sampled at most every `SAMPLE_EVERY` seconds and spending at most
    `WATCH_SHARE` of the time since the previous sample on taking it."""

    def __init__(self) -> None:
        self.total, self.by_name, self.processes = 0, {}, 0
        self.spent_s, self._due = 0.0, 0.0

    def sample(self, root: int) -> None:
        """Samples `root`'s tree if it is due."""
        started = time.monotonic()
        if started < self._due:
            return
        total, by_name, processes = tree_pss(root)
        if total > self.total:
            self.total, self.by_name, self.processes = total, by_name, processes
        cost = time.monotonic() - started
        self.spent_s += cost
        self._due = started + max(SAMPLE_EVERY, cost / WATCH_SHARE)


def watch(side: str, model: Path, out: Path, steps: int, seed: int, timeout: float, root: Path = ROOT,
          shape: Shape = SMALL) -> dict:
    """Run one side in a child process; what it took, measured from here and from its own records. `root`: the
    checkout whose fasync the child runs (bench/startup.py compares two)."""
    out.mkdir(parents=True)
    command = [sys.executable, str(root / "bench" / "peer_trl.py"), "--child", side, "--model", str(model),
               "--out", str(out), "--steps", str(steps), "--seed", str(seed)]
    if shape is not SMALL:
        # Only then: a checkout from before `--shape` (bench/startup.py's "before") runs the small shape as well.
        command += ["--shape", shape.name]
    records = out / ("steps.jsonl" if side == "trl" else "run/metrics.jsonl")
    reward_key = "reward" if side == "trl" else "rollout_reward_mean"
    log = (out / "log.txt").open("w")
    started = time.monotonic()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *(path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path)])}
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=root, env=environment)
    peak, first_step, seen_size, step_cpu = PeakMemory(), None, 0, []
    while True:
        done = child.poll() is not None
        if not done:
            peak.sample(child.pid)
        now = time.monotonic() - started
        size = records.stat().st_size if records.exists() else 0
        if first_step is None and size:
            first_step = now
        if size != seen_size and not done:
            # The side's CPU seconds when each step's record appeared.
            seen_size = size
            recorded = len(step_lines(records))
            step_cpu += [tree_cpu_s(child.pid)] * (recorded - len(step_cpu))
        if done:
            break
        if now > timeout:
            child.kill()
            break
        time.sleep(0.1)
    lines = step_lines(records)
    stamps = [r["time"] if side == "trl" else r["wall_time"] for r in lines]
    # Per step: the steady steps, from the third on (the first ones pay for warming up).
    deltas = [b - a for a, b in zip(stamps[2:], stamps[3:])]
    cpu_deltas = [b - a for a, b in zip(step_cpu[2:], step_cpu[3:])]
    # Each step's reward and its time since the process started: the first step as seen from here, the
    # later ones by the run's own clock.
    series = [[first_step + stamp - stamps[0], record[reward_key]] for stamp, record in zip(stamps, lines)] \
        if first_step is not None else []
    result = {"side": side, "exit": child.wait(), "steps": len(lines), "first_step_s": first_step,
              "series": series, "step_ms": 1000 * statistics.median(deltas) if deltas else None,
              "step_cpu_s": statistics.median(cpu_deltas) if cpu_deltas else None,
              "peak_pss_gib": peak.total / 2**30, "peak_processes": peak.processes, "sampling_s": peak.spent_s,
              "peak_by_process_mib": {name: round(size / 2**20) for name, size in
                                      sorted(peak.by_name.items(), key=lambda item: -item[1])}}
    if side == "ray":
        result["first_step_s"] = None
        ready = out / "ready"
        result["ray_init_s"] = float(ready.read_text()) if ready.exists() else None
    elif side != "trl" and lines and first_step is not None:
        # The first record's wall_time counts from when the run opened its metrics file, after Ray's start and
        # before the actors': what comes before it is imports, config and Ray's start.
        result["before_metrics_s"] = first_step - lines[0]["wall_time"]
    if side != "ray":
        # TRL's records time its generation only (`run_trl`).
        steady = lines[2:]
        for key in ("generate_time_s", "train_call_time_s", "train_time_s", "weight_sync_time_s"):
            values = [r[key] for r in steady if r.get(key) is not None]
            result[f"{key[:-2]}_ms"] = 1000 * statistics.median(values) if values else None
    return result


# -- report ----------------------------------------------------------------------------------------


def reach(result: dict, target: float) -> tuple[int, float] | None:
    """(steps, seconds since the process started) when the last-3-step mean reward first reached `target`."""
    series = result.get("series") or []
    for index in range(REWARD_WINDOW - 1, len(series)):
        if statistics.mean(reward for _, reward in series[index + 1 - REWARD_WINDOW:index + 1]) >= target:
            return index + 1, series[index][0]
    return None


def with_target(results: dict[str, list[dict]], target: float) -> None:
    for runs in results.values():
        for run in runs:
            hit = reach(run, target)
            run["steps_to_target"], run["time_to_target_s"] = hit if hit else (None, None)


def median(results: list[dict], key: str) -> float | None:
    values = [r[key] for r in results if r.get(key) is not None]
    return statistics.median(values) if values else None


def small_setup(steps: int, vocabulary: int) -> list[str]:
    return [
        f"- model (both sides): the files written by `write_model` in bench/peer_trl.py: `LlamaForCausalLM` "
        f"{json.dumps(MODEL)}, vocabulary {len(SPECIALS) + len(TASK_ALPHABET)} (character-level, no chat template), "
        "float32, seed 0",
        "- data and reward (both sides): `fasync.data.tasks.generate_problems('reverse', 6, 4096, seed)`, "
        "`fasync.data.rewards.partial_match`; one torch thread per process",
        f"- fasync: `fasync train configs/quickstart.yaml` with `{' '.join(FASYNC_COMMON)} model.path=MODEL "
        f"train.num_rollouts={steps} train.target_reward={SMALL.target}` and, per mode, the sections of its example "
        "config (`mode=sync`; `configs/async.yaml`; `configs/fully_async.yaml`)",
    ]


def medium_setup(task: medium.Task, steps: int, vocabulary: int) -> list[str]:
    if task.warm_start_steps:
        model = (f"fine-tuned by it on the prompts' two answers for {task.warm_start_steps} steps "
                 f"(`fasync.bench.warm_start.fine_tune`, {medium.WARM_START_BATCH} answers a step, AdamW at "
                 f"{medium.WARM_START_LR})")
        prompts = (f"`continue:` and {medium.WORDS_PER_PROMPT} consecutive words of a cycle of "
                   f"{medium.WORDS // 2}, each answered by the next {medium.WORDS_PER_PROMPT} (`fasync.bench.medium."
                   "continuations`)")
    else:
        model = "as bench/medium_shape.py writes it"
        prompts = f"`reverse:` and {medium.WORDS_PER_PROMPT} words"
    return [
        f"- model (both sides): the directory written by `fasync.bench.medium.write_files`, {model}: "
        f"`LlamaForCausalLM` {json.dumps(medium.MODEL)}, vocabulary {vocabulary} (byte-level BPE trained in code on "
        f"the task's {medium.WORDS} pseudo-words, chat template `{medium.TEMPLATE}`), float32, seed 0",
        f"- data and reward (both sides): the {medium.POOL} prompts {prompts} that `write_files` writes (fasync: "
        "`data.path`; TRL: the same rows, each prompt as a user's message, so that TRL renders it through the same "
        f"chat template), `{task.reward_spec.replace(':', '.')}`; one torch thread per process",
        f"- fasync: `fasync train medium.yaml` (`fasync.bench.medium.write_config`: {medium.PROMPTS} prompts × "
        f"{medium.SAMPLES} samples, `rollout.max_new_tokens={medium.MAX_NEW_TOKENS}`, lr {task.lr}, one optimizer step "
        f"per rollout) with `{' '.join(COMMON)} train.num_rollouts={steps} train.target_reward={task.target}` and, "
        "per mode, the sections of its example config (`mode=sync`; `configs/async.yaml`; `configs/fully_async.yaml`)",
    ]


SETUP = {"small": small_setup, "medium": partial(medium_setup, medium.REVERSE),
         "medium-target": partial(medium_setup, medium.CONTINUE)}
"""Each shape's model, data and fasync lines of its block."""


def render(shape: Shape, saved: dict, target: float) -> str:
    """The block of a `measure_all` result (`saved`: as results.json holds it)."""
    results, repeats, steps = saved["results"], saved["repeat"], saved["steps"]
    with_target(results, target)
    trl = results["trl"]
    sides = [side for side, runs in results.items() if side != "ray" and runs]
    per_step = shape.prompts * shape.samples
    header = ["side", "exit (worst)", f"reached {target}", f"steps to {target} (median)", "per step (ms)", "× TRL",
              "samples/s", "CPU per step (s)", "× TRL", f"time to {target} (s)", "× TRL", "first step (s)", "× TRL", "peak PSS (GiB)", "× TRL"]
    rows = []
    for side in sides:
        runs = results[side]
        row = [side, max(r["exit"] for r in runs), f"{sum(r['time_to_target_s'] is not None for r in runs)}/{len(runs)}",
               spread([r["steps_to_target"] for r in runs], 0)]
        for key, digits in (("step_ms", 0), ("step_cpu_s", 1), ("time_to_target_s", 1), ("first_step_s", 1),
                            ("peak_pss_gib", 2)):
            ours, theirs = median(runs, key), median(trl, key)
            row += [spread([r.get(key) for r in runs], digits),
                    fmt(ours / theirs, 2) if ours is not None and theirs else "—"]
            if key == "step_ms":
                row.append(spread([1000 * per_step / r[key] if r[key] else None for r in runs], 2))
        rows.append(row)
    phases = [[side, *(spread([r.get(f"{key}_ms") for r in runs], 1)
                       for key in ("generate_time", "train_call_time", "train_time", "weight_sync_time")),
               spread([r["step_ms"] for r in runs], 0)]
              for side, runs in results.items() if side != "ray" and runs]

    def top(runs: list[dict]) -> str:
        """The largest processes at the peak of the side's first run."""
        return ", ".join(f"{name} {size}" for name, size in list(runs[0]["peak_by_process_mib"].items())[:6])

    where = [[side, spread([r["first_step_s"] for r in results[side]], 1),
              spread([r.get("before_metrics_s") for r in results[side]], 1),
              spread([r["peak_pss_gib"] for r in results[side]], 2), top(results[side])] for side in sides]
    if results.get("ray"):
        where.append(["Ray alone (started as `fasync train` starts it, then idle)",
                      "`ray.init` " + spread([r.get("ray_init_s") for r in results["ray"]], 1), "—",
                      spread([r["peak_pss_gib"] for r in results["ray"]], 2), top(results["ray"])])

    def ratio(side: str, key: str) -> float | None:
        if not results.get(side):
            return None
        ours, theirs = median(results[side], key), median(trl, key)
        return ours / theirs if ours is not None and theirs else None

    def verdict(value: float | None, limit: float, key: str) -> str:
        if value is None:
            return f"not measured: a side did not reach {target}" if key == "time_to_target_s" else "not measured"
        return "met" if value <= limit else "missed"

    goals = [[what.format(target=target), fmt(ratio(side, key), 2), verdict(ratio(side, key), limit, key)]
             for what, side, key, limit in shape.goals]
    if shape is SMALL:
        # Issue 31 §5's goals are the small shape's; the medium shape reports the same ratios in its table.
        goals += [*[[f"{side} first step ≤ 1.5× TRL's", fmt(ratio(side, "first_step_s"), 2),
                     verdict(ratio(side, "first_step_s"), 1.5, "first_step_s")] for side in sides[1:]],
                  *[[f"{side} peak memory ≤ 2× TRL's", fmt(ratio(side, "peak_pss_gib"), 2),
                     verdict(ratio(side, "peak_pss_gib"), 2.0, "peak_pss_gib")] for side in sides[1:]]]
    import torch
    import transformers

    try:
        import trl as trl_package
        trl_version = trl_package.__version__
    except ImportError:
        trl_version = "not installed"
    # Results kept before the rounds were seeded ran every round with seed 0.
    seeds = "round r with seed r" if saved.get("seeded_rounds") else "every run with seed 0"
    load = saved.get("load")
    # Results kept before the load was recorded say only the load at the end.
    conditions = (load_sentence(load["before"], load["after"], load["capacity"]) if load
                  else f"load average at the end {load_average()}")
    return "\n\n".join([
        f"{measured(sys.argv)}; {conditions}. Each side ran {repeats}× in turn with the "
        f"others ({seeds}), at most {steps} optimizer steps, stopping at a 3-step mean reward of {shape.target}; "
        f"time to target is to a 3-step mean of {target}, from the process's start; each cell is "
        "the median of a side's runs with the range in brackets, and every ratio is the side's median over "
        f"TRL's. torch {torch.__version__}, transformers {transformers.__version__}, trl {trl_version}.",
        "\n".join([
            *SETUP[shape.name](steps, saved.get("vocabulary")),
            "- TRL: `GRPOTrainer` with `GRPOConfig(" + ", ".join(
                f"{k}={v!r}" for k, v in trl_settings(shape, Path("OUT"), steps, 0).items()
                if k not in ("output_dir", "seed")) + ")`, `torch.set_num_threads(1)`",
        ]),
        table(header, rows),
        f"samples/s: the {per_step} samples of an optimizer step over each run's median time per step. CPU per "
        "step: the CPU seconds (user and system) of the side's process and everything it started, Ray's and the "
        "actors' included, between two steps' records (median from the third step on): the work a step costs, "
        "which other work on the machine delays but does not add to, so it compares sides measured under "
        "different loads better than the wall clock does. "
        "The phases per optimizer step, in ms (medians of the per-step values from the third step on): generate "
        "(fasync: engine time; TRL: its `GRPOTrainer._generate`, transformers' `generate` with its prompts' "
        "tokenization and the completions' ids), train call (what fasync's driver waited for the trainer: the step "
        "plus moving and collating the samples), train (the optimizer step as fasync's trainer times it), weight "
        "sync; TRL times none but its generation, and the rest of its step is the reward, the loss's forward and "
        "backward, and the optimizer step:",
        table(["side", "generate", "train call", "train", "weight sync", "per step (wall)"], phases),
        "Where the start-up and the memory go: the first step's latency, the part of it before the run opened "
        "its metrics file (fasync only: imports, config and Ray's start; the actors start, load the model and "
        "take the first rollout and step after it), the peak PSS, and the largest processes at that peak "
        "(MiB, first run):",
        table(["side", "first step (s)", "before the metrics file (s)", "peak PSS (GiB)",
               "largest processes at the peak (MiB)"], where),
        table(["goal", "ratio", "verdict"], goals),
    ])


def measure_all(shape: Shape, args, out: Path) -> dict:
    """Ray alone, then each side, `args.repeat` rounds; results.json in `out` after every run. What it returns (and
    results.json holds): the shape, the rounds, the steps, the model's vocabulary, the load before the runs and
    the runs' results by side."""
    load = {"before": list(os.getloadavg()), "capacity": parallel_capacity()}
    model = shape.write_files(out, args.steps)
    vocabulary = json.loads((model / "config.json").read_text())["vocab_size"]
    results: dict[str, list[dict]] = {side: [] for side in args.sides}
    results["ray"] = []
    saved = {"shape": shape.name, "repeat": args.repeat, "steps": args.steps, "vocabulary": vocabulary, "load": load,
             "seeded_rounds": True, "results": results}
    for repeat in range(args.repeat):
        for side in ("ray", *args.sides):
            # Round r runs every side with seed r: the rounds differ in what they sample, as runs do.
            result = watch(side, model, out / f"{side}-{repeat}", args.steps, repeat, args.timeout, shape=shape)
            results[side].append(result)
            print(f"peer: {side} ({repeat + 1}/{args.repeat}): " + ", ".join(
                f"{k} {fmt(v, 3) if isinstance(v, float) else v}" for k, v in result.items()
                if k not in ("side", "series")), flush=True)
            if result["exit"] != 0:
                print(f"peer: {side} exited {result['exit']}; its log: {out / f'{side}-{repeat}' / 'log.txt'}",
                      flush=True)
            (out / "results.json").write_text(json.dumps(saved, indent=1))
    load["after"] = load_average()
    (out / "results.json").write_text(json.dumps(saved, indent=1))
    return saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPES), default=SMALL.name,
                        help="The work both sides do: the quickstart's (small), bench/medium_shape.py's (medium) or "
                        "the medium shape's learnable task (medium-target).")
    parser.add_argument("--repeat", type=int, default=2, help="Rounds over the four sides.")
    parser.add_argument("--steps", type=int, default=400, help="Most optimizer steps per run.")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds before a run is killed.")
    parser.add_argument("--out", type=Path, default=None, help="Keep the runs here (default: a temporary folder).")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/benchmarks.md alone.")
    parser.add_argument("--target", type=float, default=None,
                        help="Reward (3-step mean) that time to target is measured at; runs stop at the shape's "
                        f"target ({', '.join(f'{shape.name} {shape.target}' for shape in SHAPES.values())}), the "
                        "default.")
    parser.add_argument("--render", type=Path, default=None,
                        help="Only render the tables from a results.json an earlier run left in its --out (at the "
                        "shape it was run at).")
    parser.add_argument("--child", choices=[*SIDES, "ray"], help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    if args.child is not None:
        if args.child == "trl":
            run_trl(shape, args.model, args.out, args.steps, args.seed)
            return 0
        if args.child == "ray":
            run_ray_alone(args.out)
            return 0
        return run_fasync(shape, args.child, args.model, args.out, args.steps, args.seed)

    if "trl" in args.sides and args.render is None:
        try:
            import trl  # noqa: F401
        except ImportError:
            print("bench/peer_trl.py: trl is not installed in this Python; run `make venv-peer` and use "
                  ".venv-peer/bin/python (the `peer` extra is never part of the default install)", file=sys.stderr)
            return 2
    if "trl" not in args.sides:
        parser.error("--sides must include trl: every figure is a ratio to it")
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        # Results kept before `--shape` are the small shape's.
        shape = SHAPES[saved.get("shape", SMALL.name)]
        text = render(shape, saved, args.target if args.target is not None else shape.target)
    else:
        with tempfile.TemporaryDirectory(prefix="fasync-peer-") as scratch:
            out = args.out or Path(scratch)
            out.mkdir(parents=True, exist_ok=True)
            saved = measure_all(shape, args, out)
            text = render(shape, saved, args.target if args.target is not None else shape.target)
    print(text)
    if not args.no_write:
        write_block(DOC, shape.block, text, "`.venv-peer/bin/python bench/peer_trl.py`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
