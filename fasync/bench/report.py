"""`fasync bench` end to end: run the scenarios, render the tables, write them into docs/benchmarks.md.

The document's prose is hand-written; the script replaces only the blocks between
`<!-- bench-NAME:begin -->` and `<!-- bench-NAME:end -->`, so every number in it comes from a run.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fasync.bench.modes import (
    COMMON,
    LONG_TAIL,
    LongTail,
    ScenarioResult,
    TrainCommand,
    run_scenario,
    speedups,
    standard_scenario,
    variant_overrides,
)
from fasync.metrics.measure import CORRECTION_METRICS, ideal_speedup
from fasync.modes import ASYNC_MODES
from fasync.report.markdown import fmt, table

GOALS = {"async": 0.85, "fully_async": 0.9}
"""Throughput speedup over sync, as a fraction of the ideal overlap, that each mode aims for."""


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
              if line.startswith("model name")] if cpuinfo.exists() else []
    cpu = models[0] if models else (platform.processor() or "unknown CPU")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {memory:.0f} GiB RAM, Python {platform.python_version()}"


def _count(seconds_queue, loops: int) -> None:
    started = time.perf_counter()
    total = 0
    for i in range(loops):
        total += i
    seconds_queue.put(time.perf_counter() - started)


def parallel_capacity(loops: int = 10_000_000) -> float:
    """Cores' worth of work two busy processes get done at once, from the time of a fixed loop run alone
    and run twice side by side: 2.0 on two free cores, less when the cores are shared underneath."""
    context = multiprocessing.get_context("spawn")

    def run(copies: int) -> float:
        seconds = context.Queue()
        workers = [context.Process(target=_count, args=(seconds, loops)) for _ in range(copies)]
        for worker in workers:
            worker.start()
        times = [seconds.get() for _ in workers]
        for worker in workers:
            worker.join()
        return statistics.mean(times)

    alone = min(run(1) for _ in range(2))
    return 2 * alone / run(2)


def spread(values: list, digits: int) -> str:
    """The median of the values given (None left out) with their range in brackets, "—" for none."""
    present = [v for v in values if v is not None]
    if not present:
        return "—"
    middle = fmt(statistics.median(present), digits)
    return middle if len(present) == 1 else f"{middle} ({fmt(min(present), digits)}–{fmt(max(present), digits)})"


def load_average() -> str:
    """The machine's load average over 1, 5 and 15 minutes, as the pages print it."""
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def under_load(load_before: list[float], capacity: float) -> bool:
    """Whether other work shared the cores when a benchmark started: a 1-minute load average of 1 or more before
    it, or two busy processes getting under 1.8 cores' worth of work done at once (`parallel_capacity`)."""
    return load_before[0] >= 1.0 or capacity < 1.8


def load_sentence(load_before: list[float], load_after: str, capacity: float) -> str:
    """The load a benchmark ran under, as its setup line says it: the load average before and after (`load_average`),
    the parallel capacity, and whether the figures were taken under load."""
    condition = ("**taken under load**: other work shared the two cores (load average and capacity above), so "
                 "every figure is lower than on a quiet machine" if under_load(load_before, capacity)
                 else "a quiet machine")
    return (f"load average before the runs {' / '.join(f'{v:.2f}' for v in load_before)}, after {load_after}; two "
            f"busy processes got {fmt(capacity, 2)} cores' worth of work done at once (2.00 on two free cores): "
            f"{condition}")


def commit() -> str:
    """The commit of the checkout the command runs in (its working directory), marked when it has changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=False).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return (git("rev-parse", "--short", "HEAD") or "unknown") + (" (with uncommitted changes)" if dirty else "")


def invocation(argv: list[str]) -> str:
    """The command as a user would retype it from the working directory (the repository root)."""
    program = Path(argv[0])
    head = ["fasync"] if program.name == "fasync" else ["python", os.path.relpath(program)]
    return shlex.join([*head, *argv[1:]])


def measured(argv: list[str]) -> str:
    """The provenance sentence a generated block starts with: when, where, which commit, which command."""
    return (f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} on {machine()}, commit {commit()}, with "
            f"`{invocation(argv)}`")


def write_block(doc: Path, name: str, text: str, writer: str = "`fasync bench`") -> None:
    """Replace the generated block `name` in `doc`, appending it when the document has none yet."""
    begin, end = f"<!-- bench-{name}:begin -->", f"<!-- bench-{name}:end -->"
    block = f"{begin}\n<!-- Written by {writer}; rerun it instead of editing. -->\n{text.strip()}\n{end}"
    current = doc.read_text() if doc.exists() else ""
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    updated = pattern.sub(lambda _: block, current) if pattern.search(current) else \
        current.rstrip() + "\n\n" + block + "\n"
    doc.write_text(updated.lstrip())


def mode_table(result: ScenarioResult) -> str:
    shown = [key for key in CORRECTION_METRICS if any(key in r.correction for r in result.reports)]
    header = ["mode", "exit", "rollouts", "samples/s (runs)", f"time to {result.target} (s, runs reaching it)",
              "staleness mean", "staleness max", "dropped as stale", "trainer idle", "rollouter idle", *shown]
    rows = []
    for label, r in result.by_label().items():
        runs = r.runs_samples_per_s
        spread = f" ({fmt(min(runs), 0)}–{fmt(max(runs), 0)})" if len(runs) > 1 else ""
        rows.append([label, r.exit_code, r.rollouts, fmt(r.samples_per_s, 0) + spread,
                     f"{fmt(r.time_to_target_s, 1)} ({r.runs_reached}/{len(runs)})", r.staleness_mean,
                     r.staleness_max, fmt(r.stale_dropped, 3), fmt(r.trainer_idle, 2), fmt(r.rollouter_idle, 2),
                     *(r.correction.get(key) for key in shown)])
    return table(header, rows)


def phase_table(result: ScenarioResult) -> str:
    """Per rollout (drain) of the steady window, in milliseconds."""
    header = ["mode", "wall", "generate", "train steps", "train call", "weight sync (held)"]
    rows = []
    for label, r in result.by_label().items():
        per = 1000 / max(r.rollouts - 1, 1)
        rows.append([label, *(fmt(seconds * per, 1) for seconds in
                              (r.window_s, r.generate_s, r.train_s, r.train_call_s, r.weight_sync_s))])
    return table(header, rows)


def overlap_table(result: ScenarioResult) -> str:
    header = ["mode", "throughput speedup", "of ideal", "goal", f"time-to-{result.target} speedup", "of ideal"]
    rows = []
    for label, s in speedups(result).items():
        if label == result.scenario.reference:
            continue
        goal = GOALS.get(label)
        met = None if goal is None or s["throughput_of_ideal"] is None else s["throughput_of_ideal"] >= goal
        rows.append([label, *(fmt(s[key], 2) for key in ("throughput_speedup", "throughput_of_ideal")),
                     "—" if goal is None else f"≥ {goal}: {fmt(met)}",
                     *(fmt(s[key], 2) for key in ("time_to_target_speedup", "time_to_target_of_ideal"))])
    return table(header, rows)


def comparison(result: ScenarioResult) -> str:
    reports = result.by_label()
    reference = result.scenario.reference
    base = reports[reference]
    lines = []
    for label, s in speedups(result).items():
        if label == reference:
            continue
        report = reports[label]
        per_rollout = [1000 * r.window_s / max(r.rollouts - 1, 1) for r in (report, base)]
        lines.append(f"- {label} against {reference}: {fmt(s['throughput_speedup'], 2)}× the samples/s "
                     f"({fmt(per_rollout[0], 0)} ms per rollout against {fmt(per_rollout[1], 0)} ms); reward "
                     f"{result.target} after {fmt(report.time_to_target_s, 1)} s against "
                     f"{fmt(base.time_to_target_s, 1)} s ({fmt(s['time_to_target_speedup'], 2)}× as fast).")
    return "\n".join(lines)


def overrides_list(result: ScenarioResult, examples: Path, shown_data: dict[str, str]) -> str:
    def show(items: list[str]) -> str:
        for path, name in shown_data.items():
            items = [item.replace(path, name) for item in items]
        return " ".join(items)

    return "\n".join(f"- {v.label}: `{show(variant_overrides(result.scenario, v, examples))}`"
                     for v in result.scenario.variants)


def render(config: str, overrides: list[str], command: str, target: float, repeats: int,
           results: list[ScenarioResult], context: dict, examples: Path) -> dict[str, str]:
    standard = results[0]
    sync = standard.by_label()["sync"]
    shown = context.get("shown_data", {})
    blocks = {
        "setup": "\n".join([
            f"- date: {context['started']}",
            f"- machine: {machine()}",
            f"- load average before the runs: {context['load']}; two busy processes got "
            f"{fmt(context['capacity'], 2)} cores' worth of work done at once (2.00 on two free cores)",
            f"- command: `{command}`",
            f"- commit: {commit()}",
            f"- base config: `{config}`" + (f" with `{' '.join(overrides)}`" if overrides else ""),
            f"- every run: `{' '.join(COMMON)} train.target_reward={target}`, then its own overrides below; "
            f"each mode ran {repeats}× (in turn with the others) and each number is the median of its runs",
        ]),
        "modes": "\n\n".join([overrides_list(standard, examples, shown), mode_table(standard),
                              "Milliseconds per rollout (fully_async: per drain) in the steady window:",
                              phase_table(standard)]),
        "overlap": "\n\n".join([
            f"Sync's phases in its steady window: generate {fmt(sync.generate_s, 2)} s, train (optimizer "
            f"steps) {fmt(sync.train_s, 2)} s, so the ideal overlap speedup is ({fmt(sync.generate_s, 2)} + "
            f"{fmt(sync.train_s, 2)}) / max({fmt(sync.generate_s, 2)}, {fmt(sync.train_s, 2)}) = "
            f"**{fmt(ideal_speedup(sync), 2)}×**. Throughput speedup: samples/s over sync's samples/s (the goal "
            f"column); time-to-target speedup: sync's time to {target} over the mode's, start-up included.",
            overlap_table(standard),
        ]),
    }
    if len(results) > 1:
        tail = results[1]
        blocks["long-tail"] = "\n\n".join([tail.scenario.description, overrides_list(tail, examples, shown),
                                           mode_table(tail), "Milliseconds per rollout (drain):", phase_table(tail),
                                           comparison(tail)])
    return blocks


def curves(result: ScenarioResult, directory: Path, links_from: Path | None = None) -> str:
    """The charts of each variant's first run that wrote metrics (`fasync report`) written into `directory`, as
    markdown that embeds them, with links relative to `links_from` (the document's directory) when given."""
    from fasync.report import ReportError, load_runs, write_report

    def readable(run_dir: Path) -> bool:
        try:
            load_runs([run_dir])
        except ReportError:
            return False
        return True

    # A run that failed before its first step has nothing to draw: the variant's next run stands in.
    chosen = {variant.label: next((d for d in result.run_dirs[variant.label] if readable(d)), None)
              for variant in result.scenario.variants}
    shown = {label: run_dir for label, run_dir in chosen.items() if run_dir is not None}
    missing = [label for label, run_dir in chosen.items() if run_dir is None]
    note = f" No curves for {', '.join(missing)}: no run of it wrote a metrics row." if missing else ""
    if not shown:
        return "No curves: no run wrote a metrics row."
    report = write_report(list(shown.values()), directory, labels=list(shown),
                          title=f"fasync bench: {result.scenario.name}, the first run of each variant that wrote metrics",
                          show_paths=False)

    def link(path: Path) -> str:
        return os.path.relpath(path, links_from).replace(os.sep, "/") if links_from is not None else str(path)

    lines = [f"Curves of the first run of each variant ([their report]({link(report)}), `fasync report`).{note}", ""]
    lines += [f"![{name}]({link(directory / f'{name}.png')})" for name in ("reward", "staleness", "queue",
                                                                         "correction", "time")]
    return "\n".join(lines)


def benchmark(train: TrainCommand, config: str, overrides: list[str], out_dir: Path | None = None,
              doc: Path | None = None,
              long_tail: LongTail | None = LONG_TAIL, repeats: int = 1, target: float | None = None,
              command: str | None = None, examples: Path | None = None) -> tuple[list[ScenarioResult], dict[str, str]]:
    """Run the scenarios; write the blocks into `doc` when given. Returns the results and the blocks.

    Each mode's settings come from its example config (`async.yaml`, `fully_async.yaml`) in `examples`,
    by default the directory of `config`."""
    from fasync.config.loader import load_config
    from fasync.errors import ConfigurationError

    examples = examples if examples is not None else Path(config).resolve().parent
    missing = [f"{mode}.yaml" for mode in ASYNC_MODES if not (examples / f"{mode}.yaml").is_file()]
    if missing:
        raise ConfigurationError(f"fasync bench: {examples} has no {' or '.join(missing)}: the modes' settings are read "
                         "from the example configs beside the base config (see configs/ in the repository)")

    loaded = load_config(config, overrides)
    if loaded.config is None:
        raise ConfigurationError(f"fasync bench: {config} does not load (run `fasync check {config}`)")
    target = target if target is not None else (loaded.config.train.target_reward or 0.9)
    context = {"started": time.strftime("%Y-%m-%d %H:%M %Z"),
               "load": load_average(),
               "capacity": parallel_capacity()}
    with tempfile.TemporaryDirectory(prefix="fasync-bench-") as scratch:
        out = out_dir or Path(scratch)
        results = [run_scenario(train, standard_scenario(), config, overrides, out, target, examples, repeats)]
        if long_tail is not None:
            dataset = long_tail.write_dataset(out / "long-tail.jsonl")
            context["shown_data"] = {str(dataset): dataset.name}
            results.append(run_scenario(train, long_tail.scenario(dataset), config, overrides, out, target, examples,
                                        repeats))
        blocks = render(config, overrides, command or invocation(sys.argv), target, repeats, results, context,
                        examples)
        # Beside the document (docs/benchmarks/<scenario>/), else in the kept run directory; a temporary
        # directory's charts would vanish with it.
        charts = doc.parent / doc.stem if doc is not None else (out / "charts" if out_dir is not None else None)
        if charts is not None:
            for result, block in zip(results, ("modes", "long-tail")):
                blocks[block] += "\n\n" + curves(result, charts / result.scenario.name,
                                                  doc.parent if doc is not None else None)
        (out / "report.json").write_text(json.dumps(
            {r.scenario.name: {label: rep.as_dict() for label, rep in r.by_label().items()} for r in results},
            indent=2))
    if doc is not None:
        for name, text in blocks.items():
            write_block(doc, name, text)
    return results, blocks
