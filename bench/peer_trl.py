"""fasync against TRL's GRPOTrainer on the same work: the quickstart task and reward, one tiny Hugging Face
model written here in code, 32 prompts × 8 samples per step, lr 2e-3, 6 new tokens, one torch thread.

    make venv-peer                                   # .venv-peer: torch, fasync and the `peer` extra (trl)
    .venv-peer/bin/python bench/peer_trl.py [--repeat 2] [--steps 400] [--no-write]

Runs TRL, then fasync sync, async and fully_async, in turn, `--repeat` times (interleaved, so that a machine
that slows down for a while slows every side alike). Each run is a fresh Python process, timed and watched
from here: time to its first optimizer step and to the target reward (from the process's start, imports
included), its own per-step times, and its peak memory as PSS summed over the process and everything it
started (Ray's processes and actors included). Writes the table into docs/benchmarks.md (section Against
TRL), with both sides' settings, as ratios to TRL.
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

from fasync.bench.llama import SPECIALS, save_llama  # noqa: E402
from fasync.bench.report import fmt, load_average, measured, spread, table, write_block  # noqa: E402
from fasync.metrics.measure import REWARD_WINDOW  # noqa: E402
from fasync.model.tokenizer import TASK_ALPHABET  # noqa: E402
from fasync.modes import MODES  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
PROMPTS, SAMPLES, LR, NEW_TOKENS, TARGET = 32, 8, 2e-3, 6, 0.9
SIDES = ("trl", *MODES)
FASYNC_COMMON = ("resources.rollout_threads=1", "resources.train_threads=1", "logging.progress=none",
                 "train.micro_batch_size=256", "train.global_batch_size=256")
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


# -- the two sides, each run as a child process ------------------------------------------------------


def trl_settings(out: Path, steps: int, seed: int) -> dict:
    return dict(output_dir=str(out / "trl"), per_device_train_batch_size=PROMPTS * SAMPLES,
                num_generations=SAMPLES, max_completion_length=NEW_TOKENS, learning_rate=LR,
                lr_scheduler_type="constant", temperature=1.0, beta=0.0, num_iterations=1, loss_type="dapo",
                scale_rewards="group", epsilon=0.2, max_grad_norm=1.0, weight_decay=0.0, max_steps=steps,
                logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
                disable_dropout=True, seed=seed, dataloader_num_workers=0)


def run_trl(model: Path, out: Path, steps: int, seed: int) -> None:
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from fasync.data.rewards import partial_match
    from fasync.data.tasks import generate_problems

    # The quickstart's pool: data.task reverse, data.length 6, data.num_prompts 4096, data.seed.
    problems = generate_problems("reverse", 6, 4096, seed)
    dataset = Dataset.from_list([{"prompt": p.prompt, "label": p.label} for p in problems])

    def reward(completions, label, **_):
        return [partial_match(completion, answer) for completion, answer in zip(completions, label)]

    steps_file = (out / "steps.jsonl").open("w")
    rewards: list[float] = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "reward" not in logs:
                return
            rewards.append(logs["reward"])
            steps_file.write(json.dumps({"step": state.global_step, "time": time.time(),
                                         "reward": logs["reward"]}) + "\n")
            steps_file.flush()
            if len(rewards) >= REWARD_WINDOW and statistics.mean(rewards[-REWARD_WINDOW:]) >= TARGET:
                control.should_training_stop = True

    tokenizer = AutoTokenizer.from_pretrained(model)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32),
                          reward_funcs=reward, args=GRPOConfig(**trl_settings(out, steps, seed)),
                          train_dataset=dataset, processing_class=tokenizer, callbacks=[Record()])
    trainer.train()


def fasync_overrides(mode: str, model: Path, steps: int, seed: int) -> list[str]:
    from fasync.bench.modes import mode_overrides

    return [*mode_overrides(mode, ROOT / "configs"), *FASYNC_COMMON, f"model.path={model}",
            f"train.num_rollouts={steps}", f"train.target_reward={TARGET}", f"train.seed={seed}",
            f"data.seed={seed}"]


def run_fasync(mode: str, model: Path, out: Path, steps: int, seed: int) -> int:
    from fasync.commands.train import run as train

    code = train(str(ROOT / "configs" / "quickstart.yaml"), fasync_overrides(mode, model, steps, seed),
                 run_dir=str(out / "run"))
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


def tree_pss(root: int) -> tuple[int, dict[str, int], int]:
    """PSS in bytes of `root` and every process descended from it: the total, by `process_name`, and how many
    processes there are."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    total, by_name, stack, count = 0, {}, [root], 0
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
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


def watch(side: str, model: Path, out: Path, steps: int, seed: int, timeout: float, root: Path = ROOT) -> dict:
    """Run one side in a child process; what it took, measured from here and from its own records. `root`: the
    checkout whose fasync the child runs (bench/startup.py compares two)."""
    out.mkdir(parents=True)
    command = [sys.executable, str(root / "bench" / "peer_trl.py"), "--child", side, "--model", str(model),
               "--out", str(out), "--steps", str(steps), "--seed", str(seed)]
    records = out / ("steps.jsonl" if side == "trl" else "run/metrics.jsonl")
    reward_key = "reward" if side == "trl" else "rollout_reward_mean"
    log = (out / "log.txt").open("w")
    started = time.monotonic()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *(path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path)])}
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=root, env=environment)
    peak, peak_by_name, peak_count, first_step = 0, {}, 0, None
    while True:
        done = child.poll() is not None
        if not done:
            total, by_name, count = tree_pss(child.pid)
            if total > peak:
                peak, peak_by_name, peak_count = total, by_name, count
        now = time.monotonic() - started
        if first_step is None and records.exists() and records.stat().st_size:
            first_step = now
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
    # Each step's reward and its time since the process started: the first step as seen from here, the
    # later ones by the run's own clock.
    series = [[first_step + stamp - stamps[0], record[reward_key]] for stamp, record in zip(stamps, lines)] \
        if first_step is not None else []
    result = {"side": side, "exit": child.wait(), "steps": len(lines), "first_step_s": first_step,
              "series": series, "step_ms": 1000 * statistics.median(deltas) if deltas else None,
              "peak_pss_gib": peak / 2**30, "peak_processes": peak_count,
              "peak_by_process_mib": {name: round(size / 2**20) for name, size in
                                      sorted(peak_by_name.items(), key=lambda item: -item[1])}}
    if side == "ray":
        result["first_step_s"] = None
        ready = out / "ready"
        result["ray_init_s"] = float(ready.read_text()) if ready.exists() else None
    elif side != "trl" and lines and first_step is not None:
        # The first record's wall_time counts from when the run opened its metrics file, after Ray's start and
        # before the actors': what comes before it is imports, config and Ray's start.
        result["before_metrics_s"] = first_step - lines[0]["wall_time"]
    if side not in ("trl", "ray"):
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


def render(results: dict[str, list[dict]], repeats: int, steps: int, target: float) -> str:
    with_target(results, target)
    trl = results["trl"]
    sides = [side for side, runs in results.items() if side != "ray" and runs]
    header = ["side", "exit (worst)", f"reached {target}", f"steps to {target} (median)", "per step (ms)", "× TRL",
              f"time to {target} (s)", "× TRL", "first step (s)", "× TRL", "peak PSS (GiB)", "× TRL"]
    rows = []
    for side in sides:
        runs = results[side]
        row = [side, max(r["exit"] for r in runs), f"{sum(r['time_to_target_s'] is not None for r in runs)}/{len(runs)}",
               spread([r["steps_to_target"] for r in runs], 0)]
        for key, digits in (("step_ms", 0), ("time_to_target_s", 1), ("first_step_s", 1), ("peak_pss_gib", 2)):
            ours, theirs = median(runs, key), median(trl, key)
            row += [spread([r[key] for r in runs], digits),
                    fmt(ours / theirs, 2) if ours is not None and theirs else "—"]
        rows.append(row)
    phases = [[side, *(spread([r.get(f"{key}_ms") for r in runs], 1)
                       for key in ("generate_time", "train_call_time", "train_time", "weight_sync_time")),
               spread([r["step_ms"] for r in runs], 0)]
              for side, runs in results.items() if side not in ("trl", "ray") and runs]

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

    def verdict(value: float | None, limit: float) -> str:
        return "not measured" if value is None else ("met" if value <= limit else "missed")

    goals = [
        ["fasync sync per step ≤ TRL's", fmt(ratio("sync", "step_ms"), 2), verdict(ratio("sync", "step_ms"), 1.0)],
        [f"fasync sync time to {target} ≤ TRL's", fmt(ratio("sync", "time_to_target_s"), 2),
         verdict(ratio("sync", "time_to_target_s"), 1.0)],
        [f"fully_async ≥ 1.4× faster than TRL to {target}", fmt(ratio("fully_async", "time_to_target_s"), 2),
         verdict(ratio("fully_async", "time_to_target_s"), 1 / 1.4)],
        *[[f"{side} first step ≤ 1.5× TRL's", fmt(ratio(side, "first_step_s"), 2),
           verdict(ratio(side, "first_step_s"), 1.5)] for side in sides[1:]],
        *[[f"{side} peak memory ≤ 2× TRL's", fmt(ratio(side, "peak_pss_gib"), 2),
           verdict(ratio(side, "peak_pss_gib"), 2.0)] for side in sides[1:]],
    ]
    load = load_average()
    import torch
    import transformers

    try:
        import trl as trl_package
        trl_version = trl_package.__version__
    except ImportError:
        trl_version = "not installed"
    return "\n\n".join([
        f"{measured(sys.argv)}; load average at the end {load}. Each side ran {repeats}× in turn with the "
        f"others, at most {steps} optimizer steps, stopping at a 3-step mean reward of {TARGET}; time to "
        f"target is to a 3-step mean of {target}, from the process's start; each cell is "
        "the median of a side's runs with the range in brackets, and every ratio is the side's median over "
        f"TRL's. torch {torch.__version__}, transformers {transformers.__version__}, trl {trl_version}.",
        "\n".join([
            f"- model (both sides): the files written by `write_model` in bench/peer_trl.py: `LlamaForCausalLM` "
            f"{json.dumps(MODEL)}, vocabulary {len(SPECIALS) + len(TASK_ALPHABET)} (character-level, no chat template), "
            "float32, seed 0",
            "- data and reward (both sides): `fasync.data.tasks.generate_problems('reverse', 6, 4096, seed)`, "
            "`fasync.data.rewards.partial_match`; one torch thread per process",
            "- TRL: `GRPOTrainer` with `GRPOConfig(" + ", ".join(
                f"{k}={v!r}" for k, v in trl_settings(Path("OUT"), steps, 0).items()
                if k not in ("output_dir", "seed")) + ")`, `torch.set_num_threads(1)`",
            f"- fasync: `fasync train configs/quickstart.yaml` with `{' '.join(FASYNC_COMMON)} model.path=MODEL "
            f"train.num_rollouts={steps} train.target_reward={TARGET}` and, per mode, the sections of its example "
            "config (`mode=sync`; `configs/async.yaml`; `configs/fully_async.yaml`)",
        ]),
        table(header, rows),
        "fasync's phases per optimizer step, in ms (medians of the per-step values from the third step on): "
        "generate (engine time), train call (what the driver waited for the trainer: the step plus moving "
        "and collating the samples), train (the optimizer step as the trainer times it), weight sync:",
        table(["mode", "generate", "train call", "train", "weight sync", "per step (wall)"], phases),
        "Where the start-up and the memory go: the first step's latency, the part of it before the run opened "
        "its metrics file (fasync only: imports, config and Ray's start; the actors start, load the model and "
        "take the first rollout and step after it), the peak PSS, and the largest processes at that peak "
        "(MiB, first run):",
        table(["side", "first step (s)", "before the metrics file (s)", "peak PSS (GiB)",
               "largest processes at the peak (MiB)"], where),
        table(["goal", "ratio", "verdict"], goals),
    ])


def measure_all(args, out: Path) -> dict[str, list[dict]]:
    """Ray alone, then each side, `args.repeat` rounds; results.json in `out` after every run."""
    model = write_model(out / "model")
    results: dict[str, list[dict]] = {side: [] for side in args.sides}
    results["ray"] = []
    for repeat in range(args.repeat):
        for side in ("ray", *args.sides):
            result = watch(side, model, out / f"{side}-{repeat}", args.steps, 0, args.timeout)
            results[side].append(result)
            print(f"peer: {side} ({repeat + 1}/{args.repeat}): " + ", ".join(
                f"{k} {fmt(v, 3) if isinstance(v, float) else v}" for k, v in result.items()
                if k not in ("side", "series")), flush=True)
            if result["exit"] != 0:
                print(f"peer: {side} exited {result['exit']}; its log: {out / f'{side}-{repeat}' / 'log.txt'}",
                      flush=True)
            (out / "results.json").write_text(json.dumps(
                {"repeat": args.repeat, "steps": args.steps, "results": results}, indent=1))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2, help="Rounds over the four sides.")
    parser.add_argument("--steps", type=int, default=400, help="Most optimizer steps per run.")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds before a run is killed.")
    parser.add_argument("--out", type=Path, default=None, help="Keep the runs here (default: a temporary folder).")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/benchmarks.md alone.")
    parser.add_argument("--target", type=float, default=TARGET,
                        help=f"Reward (3-step mean) that time to target is measured at; runs stop at {TARGET}.")
    parser.add_argument("--render", type=Path, default=None,
                        help="Only render the tables from a results.json an earlier run left in its --out.")
    parser.add_argument("--child", choices=[*SIDES, "ray"], help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        if args.child == "trl":
            run_trl(args.model, args.out, args.steps, args.seed)
            return 0
        if args.child == "ray":
            run_ray_alone(args.out)
            return 0
        return run_fasync(args.child, args.model, args.out, args.steps, args.seed)

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
        text = render(saved["results"], saved["repeat"], saved["steps"], args.target)
    else:
        with tempfile.TemporaryDirectory(prefix="fasync-peer-") as scratch:
            out = args.out or Path(scratch)
            results = measure_all(args, out)
            text = render(results, args.repeat, args.steps, args.target)
    print(text)
    if not args.no_write:
        write_block(DOC, "peer-trl", text, "`.venv-peer/bin/python bench/peer_trl.py`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
