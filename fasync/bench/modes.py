"""The mode benchmark: one base config trained in sync, async and fully_async, then the long tail.

Each mode takes its settings (the `async` and `correction` sections) from the example config of that
mode next to the base config (`async.yaml` and `fully_async.yaml`; for the default base config, the
repository's `configs/`), on top of the base config, so the benchmark measures the modes as they are
shipped. Every run uses one torch thread for
generation and one for training, so that the two can overlap on two cores. Repeated runs go round
the modes in turn, so that a machine that slows down for a while slows every mode alike.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fasync.metrics.measure import ModeReport, ideal_speedup, measure, median_report
from fasync.modes import MODES

MODE_SECTIONS = ("async", "correction")
COMMON = ("resources.rollout_threads=1", "resources.train_threads=1", "logging.progress=none")


@dataclass(frozen=True)
class Variant:
    label: str
    mode: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    variants: tuple[Variant, ...]
    reference: str
    """The variant the others are compared with."""
    overrides: tuple[str, ...] = ()
    target: float | None = None
    """Reward the time-to-target column is measured at; None: the benchmark's target, at which runs stop."""


@dataclass
class ScenarioResult:
    scenario: Scenario
    target: float
    reports: list[ModeReport] = field(default_factory=list)
    run_dirs: dict[str, list[Path]] = field(default_factory=dict)
    """Each variant's run directories, by label, in the order they ran."""

    def by_label(self) -> dict[str, ModeReport]:
        return dict(zip((v.label for v in self.scenario.variants), self.reports))


def flatten(section: str, values: dict) -> list[str]:
    """`section.key=value` overrides, values written as JSON (which the loader reads as YAML)."""
    out = []
    for key, value in values.items():
        if isinstance(value, dict):
            out += flatten(f"{section}.{key}", value)
        else:
            out.append(f"{section}.{key}={json.dumps(value)}")
    return out


def mode_overrides(mode: str, examples: Path) -> list[str]:
    """`mode=...` plus the mode's sections from its example config (sync: the base config's own)."""
    if mode == "sync":
        return ["mode=sync"]
    raw = yaml.safe_load((examples / f"{mode}.yaml").read_text()) or {}
    return [f"mode={mode}", *(item for section in MODE_SECTIONS if raw.get(section)
                              for item in flatten(section, raw[section]))]


def standard_scenario() -> Scenario:
    return Scenario("modes", "The base config in each mode.",
                    tuple(Variant(mode, mode) for mode in MODES), reference="sync")


@dataclass(frozen=True)
class LongTail:
    """Reverse problems with `short`-digit answers, a `long_fraction` of them `long`-digit ones."""

    short: int = 2
    long: int = 24
    long_fraction: float = 0.1
    pool: int = 4096
    rollouts: int = 200
    target: float = 0.5
    """What the length-then-digits reward reaches within the budget; 0.9 takes far longer."""
    micro_batch_size: int = 32
    """Small micro batches cut by length let a step of short samples cost little, so that generation,
    not the trainer, bounds the run: the regime the long tail is about."""
    slices: tuple[int, ...] = (12, 4)
    """`async.tokens_per_call` of each sliced fully_async variant: half the longest answer (within the bound,
    S008), and a slice so short that the longest answers outlive the bound."""

    def write_dataset(self, path: Path, seed: int = 0) -> Path:
        from fasync.data.tasks import generate_problems

        longs = round(self.pool * self.long_fraction)
        problems = (generate_problems("reverse", self.short, self.pool - longs, seed)
                    + generate_problems("reverse", self.long, longs, seed + 1))
        random.Random(seed).shuffle(problems)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"prompt": p.prompt, "label": p.label}) + "\n" for p in problems))
        return path

    def scenario(self, dataset: Path) -> Scenario:
        return Scenario(
            "long-tail",
            f"{self.long_fraction:.0%} of the prompts need {self.long}-digit answers, the others "
            f"{self.short}-digit ones (reverse problems in `{dataset.name}`, written by the benchmark), with "
            f"`rollout.max_new_tokens={self.long}`. The reward is `fasync.bench.rewards:length_then_digits`, "
            "under which the model learns within a few dozen rollouts to stop short answers after their "
            "digits, so generation lengths follow the data: one long prompt keeps a whole generate call "
            f"decoding for {self.long} steps. `train.micro_batch_size={self.micro_batch_size}` keeps a step "
            "of short samples cheap, so that generation bounds the run. Every run trains "
            f"{self.rollouts} rollouts; time to target is to reward {self.target}.",
            (
                Variant("async", "async"),
                *(Variant(f"fully_async (partial rollout, {tokens} tokens per call)", "fully_async",
                          ("async.partial_rollout=true", f"async.tokens_per_call={tokens}")) for tokens in self.slices),
                Variant("fully_async (partial rollout, whole calls)", "fully_async", ("async.partial_rollout=true",)),
                Variant("fully_async (no partial rollout)", "fully_async", ("async.partial_rollout=false",)),
            ),
            reference="async",
            overrides=(f"data.path={dataset}", "data.task=null", "reward.function=fasync.bench.rewards:length_then_digits",
                       f"rollout.max_new_tokens={self.long}", f"model.max_seq_len={2 * self.long + 4}",
                       f"train.micro_batch_size={self.micro_batch_size}",
                       f"train.num_rollouts={self.rollouts}", "train.target_reward=null"),
            target=self.target,
        )


LONG_TAIL = LongTail()


TrainCommand = Callable[..., int]
"""`fasync train` as the bench runs it, `train(config, overrides, run_dir=...)` → exit code: the caller hands in
`fasync.commands.train.run`, so that the bench sits below the commands (README's Layout)."""


def run_variant(train: TrainCommand, config: str, overrides: list[str], run_dir: Path) -> tuple[int, list[dict], int]:
    """Train in this process (Ray started and stopped by the run unless the caller holds a session):
    exit code, step records and the number of rollout engines."""
    code = train(config, overrides, run_dir=str(run_dir))
    return (code, *read_run_dir(run_dir))


def read_run_dir(run_dir: Path) -> tuple[list[dict], int]:
    """A run directory's step records and its number of rollout engines (what `measure` needs of a run)."""
    from fasync.metrics.writer import read_metrics

    metrics, resolved = run_dir / "metrics.jsonl", run_dir / "config.yaml"
    records = read_metrics(metrics) if metrics.exists() else []
    resources = (yaml.safe_load(resolved.read_text()) or {}).get("resources", {}) if resolved.exists() else {}
    return records, resources.get("num_rollout_engines", 1)


def variant_overrides(scenario: Scenario, variant: Variant, examples: Path) -> list[str]:
    """What a run adds to the user's overrides, each key once: the last setting of a key, which is the one
    that would win on the command line."""
    items = [*scenario.overrides, *mode_overrides(variant.mode, examples), *variant.overrides]
    keys = [item.split("=", 1)[0] for item in items]
    return [item for index, item in enumerate(items) if keys[index] not in keys[index + 1:]]


def run_scenario(train: TrainCommand, scenario: Scenario, config: str, overrides: list[str], out_dir: Path,
                 target: float, examples: Path, repeats: int = 1,
                 before_each: Callable[[Variant], None] | None = None) -> ScenarioResult:
    """Each variant `repeats` times, in turn; `before_each(variant)` runs before each run (bench/medium_shape.py
    measures the machine's peak between the runs)."""
    measured_at = scenario.target if scenario.target is not None else target
    runs: dict[str, list[ModeReport]] = {v.label: [] for v in scenario.variants}
    run_dirs: dict[str, list[Path]] = {v.label: [] for v in scenario.variants}
    for repeat in range(repeats):
        for index, variant in enumerate(scenario.variants):
            run_overrides = [*overrides, *COMMON, f"train.target_reward={target}",
                             *variant_overrides(scenario, variant, examples)]
            run_dir = out_dir / scenario.name / f"{index}-{variant.mode}-{repeat}"
            if before_each is not None:
                before_each(variant)
            started = time.monotonic()
            code, records, engines = run_variant(train, config, run_overrides, run_dir)
            report = measure(variant.mode, code, records, measured_at, engines)
            runs[variant.label].append(report)
            run_dirs[variant.label].append(run_dir)
            print(f"fasync bench: {scenario.name} / {variant.label} ({repeat + 1}/{repeats}): exit {code}, "
                  f"{report.rollouts} rollouts, {report.samples_per_s:.0f} samples/s, "
                  f"{time.monotonic() - started:.1f} s", flush=True)
    return ScenarioResult(scenario, measured_at, [median_report(runs[v.label]) for v in scenario.variants], run_dirs)


def speedups(result: ScenarioResult) -> dict[str, dict[str, float | None]]:
    """Per variant: throughput and time-to-target speedup over the scenario's reference, each also as a
    fraction of the ideal overlap computed from the reference's phases."""
    reports = result.by_label()
    base = reports[result.scenario.reference]
    ideal = ideal_speedup(base)
    out = {}
    for label, report in reports.items():
        throughput = report.samples_per_s / base.samples_per_s if base.samples_per_s else None
        to_target = (base.time_to_target_s / report.time_to_target_s
                     if base.time_to_target_s and report.time_to_target_s else None)
        out[label] = {
            "ideal": ideal,
            "throughput_speedup": throughput,
            "throughput_of_ideal": throughput / ideal if throughput is not None else None,
            "time_to_target_speedup": to_target,
            "time_to_target_of_ideal": to_target / ideal if to_target is not None else None,
        }
    return out
