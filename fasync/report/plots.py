"""The report's charts: one PNG per question, every run overlaid in its own colour.

A run keeps its colour in every chart and the run legend sits under the panels, so that five runs read
as well as one; where a panel shows two metrics of a run, the line style tells them apart and the panel's
own legend says which is which. Axis labels carry the unit the metric registry gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from fasync.metrics.measure import idle_fractions, last_per_rollout
from fasync.metrics.registry import METRICS, over
from fasync.report.runs import Run

STYLES = ("-", "--", ":", "-.")
MARKERS_BELOW = 40
"""Series with fewer points than this get markers, so that a short run's points can be counted."""
UNIT_WORDS = {"1": "unitless", "s": "s", "fraction": "fraction"}


def axis_label(text: str, unit: str) -> str:
    return f"{text} ({UNIT_WORDS.get(unit, unit)})"


STEP_AXIS = axis_label("optimizer step", "index")


def metric_label(name: str) -> str:
    return axis_label(name, METRICS[name].unit)


@dataclass(frozen=True)
class Line:
    """One metric of a panel: its name, its legend text and how a run's points are taken."""

    name: str
    legend: str
    points: Optional[Callable[[Run], tuple[list[float], list[float]]]] = None
    """(x, y) of a run; None: the metric's series against the optimizer step."""


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    lines: tuple[Line, ...]
    absent: str
    """Said in the panel when no run has any of its metrics."""
    xlabel: str = STEP_AXIS
    ylim: Optional[tuple[float, float]] = None
    bound: Optional[Callable[[Run], Optional[float]]] = None
    """A run's bound on the metric, drawn as a thin line of the run's colour."""
    bound_legend: str = ""


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, whatever the environment says
    import matplotlib.pyplot as plt

    return plt


def colours(count: int) -> list:
    plt = _pyplot()
    palette = plt.get_cmap("tab10").colors
    return [palette[i % len(palette)] for i in range(count)]


def _by_step(name: str) -> Callable[[Run], tuple[list[float], list[float]]]:
    def points(run: Run):
        steps, _, values = run.series(name)
        return steps, values

    return points


def _by_wall(name: str) -> Callable[[Run], tuple[list[float], list[float]]]:
    def points(run: Run):
        _, seconds, values = run.series(name)
        return seconds, values

    return points


def idle_series(run: Run) -> tuple[list[int], list[float], list[float]]:
    """(optimizer step at the end of each rollout, trainer idle, rollouter idle) per rollout after the first:
    the time between two rollouts' last rows outside train calls and outside generate calls
    (`fasync.metrics.measure.idle_fractions`, over one rollout instead of the steady window)."""
    ends = last_per_rollout(run.rows)
    steps, trainer, rollouter = [], [], []
    for before, end in zip(ends, ends[1:]):
        rows = [row for row in run.rows if row["rollout"] == end["rollout"]]
        idle = idle_fractions(rows, end["wall_time"] - before["wall_time"], run.engines)
        steps.append(end["step"])
        trainer.append(idle[0])
        rollouter.append(idle[1])
    return steps, trainer, rollouter


def line_width(index: int, count: int) -> float:
    """Earlier runs are drawn wider and below later ones, so that runs with equal values (staleness is an
    integer, often the same in every run) still show each colour at the edges of the line on top."""
    return 1.2 + 0.5 * (count - 1 - index)


def _draw_panel(ax, panel: Panel, runs: list[Run], palette: list) -> None:
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    drawn = set()
    for index, (run, colour) in enumerate(zip(runs, palette)):
        width = line_width(index, len(runs))
        for line, style in zip(panel.lines, STYLES):
            x, y = (line.points or _by_step(line.name))(run)
            if not x:
                continue
            drawn.add(line.legend)
            ax.plot(x, y, linestyle=style, color=colour, linewidth=width, alpha=0.9, zorder=2 + index,
                    marker="o" if len(x) < MARKERS_BELOW else None, markersize=3)
        if panel.bound is not None and panel.bound(run) is not None:
            ax.axhline(panel.bound(run), color=colour, linestyle=(0, (1, 3)), linewidth=1.2, zorder=1)
            drawn.add(panel.bound_legend)
    if not drawn:
        ax.text(0.5, 0.5, panel.absent, transform=ax.transAxes, ha="center", va="center", wrap=True,
                fontsize=9, color="0.35")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    if panel.xlabel == STEP_AXIS:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    styled = [(line.legend, style) for line, style in zip(panel.lines, STYLES) if line.legend in drawn]
    if panel.bound is not None and panel.bound_legend in drawn:
        styled.append((panel.bound_legend, (0, (1, 3))))
    if len(styled) > 1:
        from matplotlib.lines import Line2D

        ax.legend([Line2D([], [], color="0.2", linestyle=style) for _, style in styled], [text for text, _ in styled],
                  fontsize=8, loc="best")


def _figure(panels: list[Panel], runs: list[Run], title: str, path: Path, columns: int = 2) -> Path:
    plt = _pyplot()
    rows = (len(panels) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.8 * rows + 0.9), squeeze=False)
    palette = colours(len(runs))
    for ax, panel in zip(axes.flat, panels):
        _draw_panel(ax, panel, runs, palette)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    _run_legend(figure, runs, palette)
    figure.suptitle(title, fontsize=12)
    figure.tight_layout(rect=(0, _legend_height(runs, figure), 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _legend_columns(runs: list[Run]) -> int:
    return min(len(runs), 3)


def _legend_height(runs: list[Run], figure) -> float:
    lines = (len(runs) + _legend_columns(runs) - 1) // _legend_columns(runs)
    return min(0.06 + 0.28 * lines / figure.get_size_inches()[1], 0.45)


def _run_legend(figure, runs: list[Run], palette: list) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colour, linewidth=2.5) for colour in palette]
    labels = [run.label if run.mode and run.mode in run.label else f"{run.label} ({run.mode or 'mode unknown'})"
              for run in runs]
    figure.legend(handles, labels, loc="lower center", ncol=_legend_columns(runs), fontsize=9, frameon=False)


def reward_chart(runs: list[Run], path: Path) -> Path:
    reward = "rollout_reward_mean"
    label = axis_label("reward, mean over the rollout", METRICS[reward].unit)
    common = dict(ylabel=label, absent="no rollout_reward_mean in these runs",
                  bound=lambda run: run.target, bound_legend="train.target_reward")
    return _figure([
        Panel("Reward against optimizer step", lines=(Line(reward, "reward"),), **common),
        Panel("Reward against wall time", lines=(Line(reward, "reward", _by_wall(reward)),),
              xlabel=axis_label("wall time since the run started", "s"), **common),
    ], runs, "Reward", path)


def staleness_chart(runs: list[Run], path: Path) -> Path:
    return _figure([
        Panel("Staleness of the trained samples", axis_label("staleness", "versions"),
              (Line("staleness_mean", "mean over the step"), Line("staleness_max", "max over the step")),
              "no staleness in these runs", bound=lambda run: run.max_staleness,
              bound_legend="async.max_weight_staleness"),
        Panel("Policy lag", metric_label("policy_lag_max"), (Line("policy_lag_max", "max over the step"),),
              "no policy_lag_max in these runs", bound=lambda run: run.max_lag,
              bound_legend="bound (s + 1) × I × N − 1"),
    ], runs, "Staleness and policy lag", path)


def queue_chart(runs: list[Run], path: Path) -> Path:
    def idle(which: int):
        def points(run: Run):
            series = idle_series(run)
            return series[0], series[which]

        return points

    return _figure([
        Panel("Queue after each drain", metric_label("queue_size"), (Line("queue_size", "queue_size"),),
              "queue_size is written by fully_async runs only"),
        Panel("Idle fraction per rollout", axis_label("idle", "fraction"),
              (Line("train_call_time_s", "trainer (outside train calls)", idle(1)),
               Line("generate_time_s", "rollouter (outside generate calls)", idle(2))),
              "idle fractions need two rollouts or more", ylim=(-0.02, 1.02)),
    ], runs, "Queue and idle time", path)


def correction_chart(runs: list[Run], path: Path) -> Path:
    absent = "no is/ diagnostics: these runs have no off-policy correction section"
    return _figure([
        Panel("KL(behaviour ‖ training policy)", metric_label("is/kl_k3"),
              (Line("is/kl_k3", "k3 estimate"), Line("is/kl_direct", "direct estimate")), absent),
        Panel("χ² of the importance weights", metric_label("is/chi2_token"),
              (Line("is/chi2_token", "per token"), Line("is/chi2_seq", "per sequence")), absent),
        Panel("Effective sample size", metric_label("is/ess_token"),
              (Line("is/ess_token", "per token"), Line("is/ess_seq", "per sequence")), absent, ylim=(-0.02, 1.02)),
        Panel("Truncated and rejected", axis_label("share", "fraction"),
              (Line("is/truncated_token_frac", "tokens truncated"), Line("is/rejected_token_frac", "tokens rejected"),
               Line("is/rejected_seq_frac", "sequences rejected")), absent),
    ], runs, "Off-policy correction (is/ diagnostics)", path)


def agentic_chart(runs: list[Run], path: Path) -> Path:
    absent = "no agent/ metrics: these runs have no rollout.function or rollout.env"
    return _figure([
        Panel("Turns per trajectory", metric_label("agent/turns_mean"),
              (Line("agent/turns_mean", "mean"), Line("agent/turns_max", "max")), absent),
        Panel("Tool calls and errors per rollout", metric_label("agent/tool_calls"),
              (Line("agent/tool_calls", "calls"), Line("agent/tool_errors", "errors"),
               Line("agent/truncated", "truncated trajectories")), absent),
        Panel("Masked tokens (observations)", metric_label("agent/masked_token_fraction"),
              (Line("agent/masked_token_fraction", "masked"),), absent, ylim=(-0.02, 1.02)),
        Panel("Versions a trajectory spans", metric_label("agent/version_span_max"),
              (Line("agent/version_span_mean", "mean"), Line("agent/version_span_max", "max")), absent),
    ], runs, "Agentic rollouts (agent/ metrics)", path)


def eval_chart(runs: list[Run], path: Path) -> Path:
    absent = "no evaluation in these runs (the `eval` section: eval.every, eval.before_train)"
    return _figure([
        Panel("pass@k and mean@k on the eval set", axis_label("share of the eval prompts", "fraction"),
              (Line("eval/pass@k", "pass@k"), Line("eval/mean@k", "mean@k")), absent, ylim=(-0.02, 1.02)),
        Panel("Mean reward on the eval set", metric_label("eval/reward_mean"),
              (Line("eval/reward_mean", "eval reward"),), absent),
    ], runs, "Evaluation (on the row written after each evaluation finished)", path)


PHASES = (
    ("generate", "generate_time_s"),
    ("train\n(optimizer steps)", "train_time_s"),
    ("train call\n(with transfer)", "train_call_time_s"),
    ("weight sync\n(driver held)", "weight_sync_time_s"),
    ("trainer\nwaiting", "trainer_wait_s"),
    ("rollouter\npaused", "rollouter_pause_s"),
)
"""The time split: label and metric. Phases overlap in async modes, so they need not add up to the wall."""


def time_split(run: Run) -> dict[str, float]:
    """Milliseconds per optimizer step of each phase over the whole run, and the wall time per step."""
    steps = len(run.rows)
    split = {label: 1000 * over(name, run.rows) / steps for label, name in PHASES}
    split["wall\n(start-up included)"] = 1000 * run.rows[-1]["wall_time"] / steps
    return split


def time_chart(runs: list[Run], path: Path) -> Path:
    plt = _pyplot()
    splits = [time_split(run) for run in runs]
    labels = list(splits[0])
    figure, ax = plt.subplots(figsize=(12, 4.6 + 0.25 * len(runs)))
    palette = colours(len(runs))
    width = 0.8 / len(runs)
    for index, (split, colour) in enumerate(zip(splits, palette)):
        positions = [group + (index - (len(runs) - 1) / 2) * width for group in range(len(labels))]
        ax.bar(positions, [split[label] for label in labels], width=width * 0.95, color=colour)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=9)
    ax.set_ylabel(axis_label("time per optimizer step", "ms"))
    ax.set_title("Time split per optimizer step, over the whole run (phases overlap in async modes)", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    _run_legend(figure, runs, palette)
    figure.suptitle("Where the time goes", fontsize=12)
    figure.tight_layout(rect=(0, _legend_height(runs, figure), 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


CHARTS = {
    "reward": (reward_chart, "Reward against optimizer step and against wall time; the dotted line is the "
               "run's `train.target_reward`."),
    "staleness": (staleness_chart, "Staleness of the trained samples in weight versions, and the policy lag in "
                  "optimizer steps; dotted: the configured bounds."),
    "queue": (queue_chart, "The fully_async queue after each drain, and the fraction of each rollout the trainer "
              "and the rollouter were idle."),
    "correction": (correction_chart, "The off-policy correction diagnostics: KL, χ², effective sample size, and "
                   "what truncation and rejection removed."),
    "agentic": (agentic_chart, "Multi-turn trajectories: turns, tool calls and errors, truncation, the share of "
                "tokens the loss masks out, and the weight versions one trajectory's trained tokens span."),
    "eval": (eval_chart, "pass@k, mean@k and the mean reward on the eval set, at the optimizer step whose row holds "
             "each evaluation (`eval/weight_version` says which weights it evaluated)."),
    "time": (time_chart, "Milliseconds per optimizer step spent in each phase, and the wall time per step."),
}
"""Chart name (its PNG's stem) → (function, what it shows)."""


def plot_runs(runs: list[Run], out_dir: Path) -> dict[str, Path]:
    """Write every chart of `runs` into `out_dir`; returns name → PNG path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return {name: chart(runs, out_dir / f"{name}.png") for name, (chart, _) in CHARTS.items()}
