"""Start-up and footprint of `fasync train` at the small shape of bench/peer_trl.py (issue 31 §5): the first
step's latency, the peak memory, Ray's own processes and the driver's data side, for two checkouts taking turns.

    python bench/startup.py --before DIR [--repeat 3] [--steps 30] [--modes sync fully_async] [--no-write]

DIR is a checkout of the code to compare with (e.g. `git archive <commit> | tar -x -C DIR`); this checkout is
"after". Each round runs, for each checkout in turn: Ray alone (started as `fasync train` starts it, then idle),
each mode on bench/peer_trl.py's model and settings (`peer_trl.watch`: a fresh process, timed and its PSS summed
over everything it started), and the driver's data side in a fresh `python -X importtime` process. TRL's side
needs `make venv-peer`; its figures are quoted from the Against TRL table. Writes the block `startup` into
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from peer_trl import FASYNC_COMMON, fasync_overrides, watch, write_model  # noqa: E402

from fasync.bench.report import fmt, load_average, measured, spread, table, write_block  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
TRL_FIRST_STEP_S, TRL_PEAK_PSS_GIB = 4.5, 0.49
"""TRL's medians in the Against TRL table (2026-12-04, quiet machine, `bench/peer_trl.py --repeat 2`)."""

DATA_SIDE = """
import json, sys, time
started = time.monotonic()
from pathlib import Path
from fasync.commands.train import build_data, load_and_lint
from fasync.launch.plan import resolve
cfg, raw, model, failed = load_and_lint(sys.argv[1], sys.argv[2:])
data = build_data(resolve(cfg, model), Path(sys.argv[1]).parent)
print(json.dumps({"data_s": time.monotonic() - started,
                  "loaded": [name for name in ("transformers", "torch", "numpy") if name in sys.modules]}))
"""
"""What the driver does before it starts Ray: load and lint the config, resolve it, build the prompts, their
tokenizer and the reward."""


def data_side(root: Path, model: Path) -> dict:
    """The driver's data side in a fresh process of `root`'s code: its seconds (imports included), the heavy
    modules it loaded, and the top-level imports that took longest (`-X importtime`, cumulative)."""
    overrides = [item for item in fasync_overrides("sync", model, 1, 0) if not item.startswith("mode=")]
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", DATA_SIDE, "configs/quickstart.yaml",
                             *overrides], cwd=root, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(root)})
    if result.returncode != 0:
        return {"data_s": None, "loaded": [], "imports": {}, "error": result.stderr[-2000:]}
    imports = {}
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = (part.strip() for part in line.split(":", 1)[1].split("|"))
            if cumulative.isdigit() and not name.startswith(" ") and "." not in name:
                imports[name] = int(cumulative) / 1e6
    top = dict(sorted(imports.items(), key=lambda item: -item[1])[:5])
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "imports": top}


def median(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def render(results: dict, repeats: int, steps: int, before: str) -> str:
    runs = results["runs"]
    checkouts = list(runs)
    modes = [side for side in runs[checkouts[0]] if side != "ray"]

    def top(result: dict) -> str:
        return ", ".join(f"{name} {size}" for name, size in list(result["peak_by_process_mib"].items())[:6])

    def against_before(mode: str, checkout: str, key: str) -> str:
        ours, theirs = (median([r[key] for r in runs[name][mode]]) for name in (checkout, checkouts[0]))
        return fmt(ours / theirs, 2) if checkout != checkouts[0] and ours and theirs else "—"

    steps_rows = []
    for mode in modes:
        for checkout in checkouts:
            found = runs[checkout][mode]
            if not found:
                continue
            first, peak = median([r["first_step_s"] for r in found]), median([r["peak_pss_gib"] for r in found])
            worst = next((r["exit"] for r in found if r["exit"] != 0), 0)  # a run killed at the timeout: -9
            steps_rows.append([mode, checkout, worst,
                               spread([r["first_step_s"] for r in found], 1),
                               against_before(mode, checkout, "first_step_s"),
                               fmt(first / TRL_FIRST_STEP_S, 2) if first else "—",
                               spread([r.get("before_metrics_s") for r in found], 1),
                               spread([r["peak_pss_gib"] for r in found], 2),
                               against_before(mode, checkout, "peak_pss_gib"),
                               fmt(peak / TRL_PEAK_PSS_GIB, 2) if peak else "—",
                               spread([r["peak_processes"] for r in found], 0), top(found[0])])
    ray_rows = [[checkout, spread([r.get("ray_init_s") for r in runs[checkout]["ray"]], 1),
                 spread([r["peak_pss_gib"] for r in runs[checkout]["ray"]], 2),
                 spread([r["peak_processes"] for r in runs[checkout]["ray"]], 0), top(runs[checkout]["ray"][0])]
                for checkout in checkouts if runs[checkout]["ray"]]
    data_rows = [[checkout, spread([d["data_s"] for d in results["data"][checkout]], 2),
                  ", ".join(results["data"][checkout][0]["loaded"]) or "none of them",
                  ", ".join(f"{name} {seconds:.2f}" for name, seconds in results["data"][checkout][0]["imports"].items())]
                 for checkout in checkouts if results["data"][checkout]]
    load = load_average()
    return "\n\n".join([
        f"{measured(sys.argv)}; load average at the end {load}. \"before\" is {before}, \"after\" this commit; "
        f"each round ran both checkouts in turn, {repeats} rounds, each run at most {steps} optimizer steps; each "
        "cell is the median with the range in brackets. The model, data and settings are bench/peer_trl.py's "
        f"(`{' '.join(FASYNC_COMMON)} model.path=MODEL`, per mode its example config). TRL's figures "
        f"({TRL_FIRST_STEP_S} s to the first step, {TRL_PEAK_PSS_GIB} GiB peak PSS) are its medians in the "
        "table above, measured on a quiet machine: the × TRL columns divide by them, and mean something only where "
        "this run's machine was quiet too; \"÷ before\" compares the checkouts, which shared the machine's state.",
        "First step (from the process's start to its first step record) and peak PSS (summed over the driver, "
        "Ray's processes and the actors; processes counted at the peak, the largest in MiB from the first run):",
        table(["mode", "checkout", "exit (any not 0)", "first step (s)", "÷ before", "× TRL", "before the metrics file (s)",
               "peak PSS (GiB)", "÷ before", "× TRL", "processes", "largest processes at the peak (MiB)"], steps_rows),
        "Ray alone, started as `fasync train` starts it for this config, then idle for 3 s:",
        table(["checkout", "`ray.init` (s)", "peak PSS (GiB)", "processes", "largest processes (MiB)"], ray_rows),
        "The driver's data side before Ray starts (load and lint the config, resolve it, build the prompts, "
        "their tokenizer and the reward), in a fresh `python -X importtime` process: its seconds, imports "
        "included, the heavy modules it loaded, and the top-level imports that took longest (cumulative s, "
        "first run):",
        table(["checkout", "data side (s)", "loaded", "slowest imports (s)"], data_rows),
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="A checkout of the code to compare with.")
    parser.add_argument("--before-is", default=None, help="What that checkout is, for the page (default: its path).")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="Most optimizer steps per run.")
    parser.add_argument("--modes", nargs="+", default=["sync", "fully_async"])
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, default=None, help="Keep the runs here (default: a temporary folder).")
    parser.add_argument("--no-write", action="store_true", help="Print only; leave docs/benchmarks.md alone.")
    parser.add_argument("--render", type=Path, default=None,
                        help="Only render the tables from the results.json an earlier run left in its --out.")
    args = parser.parse_args()
    checkouts = {"before": args.before.resolve(), "after": ROOT}
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        text = render(saved, max(len(runs) for runs in saved["data"].values()), args.steps,
                      args.before_is or str(args.before))
        print(text)
        if not args.no_write:
            write_block(DOC, "startup", text, "`python bench/startup.py`")
        return 0
    with tempfile.TemporaryDirectory(prefix="fasync-startup-") as scratch:
        out = args.out or Path(scratch)
        model = write_model(out / "model")
        results: dict = {"runs": {label: {side: [] for side in ("ray", *args.modes)} for label in checkouts},
                         "data": {label: [] for label in checkouts}}
        for repeat in range(args.repeat):
            for label, root in checkouts.items():
                results["data"][label].append(data_side(root, model))
                for side in ("ray", *args.modes):
                    result = watch(side, model, out / f"{label}-{side}-{repeat}", args.steps, 0, args.timeout, root)
                    results["runs"][label][side].append(result)
                    print(f"startup: {label} {side} ({repeat + 1}/{args.repeat}): exit {result['exit']}, first step "
                          f"{fmt(result['first_step_s'], 2)} s, peak {result['peak_pss_gib']:.2f} GiB in "
                          f"{result['peak_processes']} processes", flush=True)
                (out / "results.json").write_text(json.dumps(results, indent=1))
        text = render(results, args.repeat, args.steps, args.before_is or str(args.before))
    print(text)
    if not args.no_write:
        write_block(DOC, "startup", text, "`python bench/startup.py`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
