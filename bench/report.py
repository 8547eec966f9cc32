"""What the bench scripts share: running a config, reading its records, and writing generated blocks
into the docs (between `<!-- NAME:begin -->` and `<!-- NAME:end -->`, so the prose around them stays
hand-written and the numbers never are)."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from fasync.metrics.writer import read_metrics

ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU") \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {memory:.0f} GiB, Python {platform.python_version()}"


def commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True, check=False).stdout.strip()
    return (result.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty else "")


def provenance(command: str) -> str:
    return (f"Measured {time.strftime('%Y-%m-%d %H:%M %Z')} on {machine()}, commit {commit()}, with\n"
            f"`{command}`.")


def train(config: str, overrides: list[str], run_dir: Path) -> tuple[int, float, list[dict]]:
    """`fasync train` in a fresh process (its own Ray cluster): exit code, wall seconds, records."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "fasync.cli", "train", config, *overrides,
                             "logging.progress=none", "--run-dir", str(run_dir)],
                            cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
    metrics = run_dir / "metrics.jsonl"
    return result.returncode, wall, read_metrics(metrics) if metrics.exists() else []


def time_to_reward(records: list[dict], target: float, window: int = 3) -> float | None:
    """Seconds since the run started at the step where the mean reward of the last `window` rollouts
    first reached `target` (the rule of `train.target_reward`), or None."""
    by_rollout: dict[int, dict] = {}
    for record in records:
        by_rollout[record["rollout"]] = record
    rewards: list[float] = []
    for record in by_rollout.values():
        rewards.append(record["rollout_reward_mean"])
        if len(rewards) >= window and sum(rewards[-window:]) / window >= target:
            return record["wall_time"]
    return None


def mean(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if 0 < abs(value) < 0.01 else f"{value:.{digits}f}"
    return str(value)


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_block(doc: Path, name: str, text: str) -> None:
    """Replace the generated block `name` in `doc` (appended at the end if it is not there yet)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n<!-- Written by a script in bench/; rerun it instead of editing. -->\n{text.strip()}\n{end}"
    current = doc.read_text() if doc.exists() else ""
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    updated = pattern.sub(lambda _: block, current) if pattern.search(current) else current.rstrip() + "\n\n" + \
        block + "\n"
    doc.write_text(updated)
    print(f"wrote {doc.relative_to(ROOT)} ({name})")
