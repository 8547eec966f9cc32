"""Time `fasync check` against the import floor of its dependencies, interleaved in the same run, and write
the table into docs/check.md.

    python bench/check_speed.py [CONFIG] [--repeat N] [--no-write]

The goal: `fasync check` takes at most 2x the time Python takes to import what it needs (pydantic, omegaconf,
typer, rich, yaml), so linting in CI or a pre-commit hook costs no more than starting its libraries.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fasync.bench.report import measured, table, write_block

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "configs" / "quickstart.yaml"
FLOOR = [sys.executable, "-c", "import pydantic, omegaconf, typer, rich, yaml"]


def seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--no-write", action="store_true", help="Print the table without writing docs/check.md.")
    args = parser.parse_args()

    check = [sys.executable, "-m", "fasync.cli", "check", str(args.config)]
    seconds(FLOOR), seconds(check)  # warm the file cache for both
    floor, checked, ratios = [], [], []
    for _ in range(args.repeat):  # interleaved: a slow moment of the machine slows both alike
        floor.append(seconds(FLOOR))
        checked.append(seconds(check))
        ratios.append(checked[-1] / floor[-1])
    rows = [["import floor (pydantic, omegaconf, typer, rich, yaml)", *_ms(floor)],
            [f"`fasync check {args.config.name}`", *_ms(checked)]]
    ratio = statistics.median(ratios)
    text = "\n\n".join([
        f"{measured(sys.argv)}; median of {args.repeat} interleaved runs.",
        table(["command", "median ms", "range ms"], rows),
        f"Ratio, median of the per-pair ratios: **{ratio:.2f}x** (range {min(ratios):.2f}–{max(ratios):.2f}x; "
        f"goal: at most 2x): {'met' if ratio <= 2 else 'missed'}."])
    print(text)
    if not args.no_write:
        write_block(ROOT / "docs" / "check.md", "check-speed", text, writer="`python bench/check_speed.py`")
    return 0


def _ms(values: list[float]) -> list[str]:
    return [f"{statistics.median(values) * 1000:.0f}", f"{min(values) * 1000:.0f}–{max(values) * 1000:.0f}"]


if __name__ == "__main__":
    sys.exit(main())
