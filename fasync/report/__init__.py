"""`fasync report RUN_DIR... [-o OUT]`: charts of one or several runs and a report.md with a summary table.

    from fasync.report import write_report, plot_runs
    write_report(["runs/a", "runs/b"], "report/")   # the PNGs and report.md; returns report.md's path
    plot_runs(["runs/a"], "plots/")                  # the PNGs only; returns chart name → path

Bad input (a directory that is not a run, an empty or cut-off metrics.jsonl) raises `ReportError`, whose
message names the file and line and says what to do. matplotlib is imported only when a chart is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from fasync.report.runs import ReportError, Run, load_runs

__all__ = ["ReportError", "Run", "load_runs", "plot_runs", "summary_rows", "write_report"]

SUMMARY = ("run", "mode", "optimizer steps", "rollouts", "wall time (s)", "final reward", "best reward",
           "time to target (s)", "samples/s", "staleness mean (versions)", "staleness max (versions)",
           "policy lag max (optimizer steps)", "trainer idle (fraction)", "rollouter idle (fraction)",
           "is/ess_token mean (fraction)", "is/kl_k3 mean (nats/token)")
"""The summary table's columns."""


def summary_rows(runs: list[Run]) -> list[list]:
    """One row per run, in `SUMMARY`'s order. Run-wide figures come from the metric registry (`over`); rates,
    idle fractions, time to target and the correction means from `fasync.metrics.measure.measure`, so that
    they are the numbers `fasync bench` reports for the same rows."""
    from fasync.metrics.measure import measure
    from fasync.metrics.registry import over

    table = []
    for run in runs:
        rows = run.rows
        measured = measure(run.mode or "", 0, rows, run.target if run.target is not None else float("inf"),
                           run.engines)
        table.append([
            run.label, run.mode or "—", len(rows), measured.rollouts, rows[-1]["wall_time"],
            rows[-1].get("rollout_reward_mean"), over("rollout_reward_mean", rows),
            measured.time_to_target_s if run.target is not None else None, measured.samples_per_s,
            over("staleness_mean", rows), over("staleness_max", rows), over("policy_lag_max", rows),
            measured.trainer_idle, measured.rollouter_idle,
            measured.correction.get("is/ess_token"), measured.correction.get("is/kl_k3"),
        ])
    return table


def plot_runs(run_dirs: list, out_dir, labels: Optional[list[str]] = None) -> dict[str, Path]:
    """Write every chart of the runs in `run_dirs` into `out_dir`; returns chart name → PNG path."""
    from fasync.report.plots import plot_runs as draw

    return draw(load_runs(run_dirs, labels), Path(out_dir))


def render_markdown(runs: list[Run], charts: dict[str, Path], out_dir: Path, title: str,
                    show_paths: bool = True) -> str:
    from fasync.report.markdown import table
    from fasync.report.plots import CHARTS

    lines = [f"# {title}", ""]
    for run in runs:
        where = f": `{run.path}`" if show_paths else ""
        resumed = f", resumed {run.resumes}×" if run.resumes else ""
        lines.append(f"- **{run.label}** ({run.mode or 'mode unknown'}, {len(run.rows)} optimizer steps"
                     f"{resumed}){where}")
    lines += ["", "Final reward is the last rollout's mean reward; time to target is the wall time at which the "
              "mean reward of the last three rollouts first reached `train.target_reward`; samples/s and idle "
              "fractions are over the steady window (after the first rollout), as `fasync bench` measures them.",
              "", table(list(SUMMARY), summary_rows(runs)), ""]
    for name, path in charts.items():
        lines += [f"## {name.capitalize()}", "", CHARTS[name][1], "",
                  f"![{name}]({path.relative_to(out_dir).as_posix()})", ""]
    return "\n".join(lines)


def write_report(run_dirs: list, out_dir, labels: Optional[list[str]] = None, title: str = "fasync report",
                 show_paths: bool = True) -> Path:
    """The charts of the runs in `run_dirs` and a report.md that embeds them under a summary table, written
    into `out_dir`; returns report.md's path."""
    from fasync.report.plots import plot_runs as draw

    runs = load_runs(run_dirs, labels)
    out = Path(out_dir)
    charts = draw(runs, out)
    report = out / "report.md"
    report.write_text(render_markdown(runs, charts, out, title, show_paths), encoding="utf-8")
    return report
