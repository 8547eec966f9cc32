"""Time `fasync check` against the import floor of its dependencies, in the same run.

    python bench/check_speed.py [CONFIG] [--repeat N]

Prints the median wall time of each command over N runs and their ratio (goal: at most 2).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIGS = (ROOT / "configs" / "quickstart.yaml", ROOT / "tests" / "configs" / "loader" / "grandchild.yaml")
FLOOR = [sys.executable, "-c", "import pydantic, omegaconf, typer, rich, yaml"]


def median_seconds(command: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", type=Path,
                        default=next((p for p in DEFAULT_CONFIGS if p.exists()), DEFAULT_CONFIGS[-1]))
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    check = [sys.executable, "-m", "fasync.cli", "check", str(args.config)]
    # Interleave warm-up runs so that neither command profits alone from a warm file cache.
    median_seconds(FLOOR, 2)
    median_seconds(check, 2)
    floor = median_seconds(FLOOR, args.repeat)
    checked = median_seconds(check, args.repeat)
    print(f"import floor (pydantic, omegaconf, typer, rich, yaml): {floor * 1000:7.1f} ms")
    print(f"fasync check {args.config.name:<38} {checked * 1000:7.1f} ms")
    print(f"ratio: {checked / floor:.2f}x (goal: at most 2x), median of {args.repeat} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
