"""The live display: a rich panel on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
from typing import Optional

STEPS_TAKEN = "steps_taken"
"""The step column counts the optimizer steps taken, as the summary's "at optimizer step N" does: a row's
`step` (metrics.jsonl) counts from 0."""

_COLUMNS = (
    ("step", STEPS_TAKEN, "{:d}"),
    ("ver", "weight_version", "{:d}"),
    ("reward", "reward_mean", "{:.3f}"),
    ("loss", "loss", "{:+.4f}"),
    ("kl", "kl", "{:.4f}"),
    ("entropy", "entropy", "{:.3f}"),
    ("stale", "staleness_max", "{:d}"),
    ("tok/s", "tokens_per_s", "{:.0f}"),
    ("t", "wall_time", "{:.1f}s"),
)


def _format(record: dict, key: str, fmt: str) -> str:
    if key == STEPS_TAKEN:
        step = record.get("step")
        value = None if step is None else step + 1
    else:
        value = record.get(key)
    if value is None:
        return "-"
    try:
        return fmt.format(int(value) if "d" in fmt else value)
    except (TypeError, ValueError):
        return str(value)


def format_line(record: dict) -> str:
    return "  ".join(f"{label} {_format(record, key, fmt)}" for label, key, fmt in _COLUMNS)


class Progress:
    """Shows each optimizer step's key metrics; `style` is logging.progress."""

    def __init__(self, total_rollouts: int, style: str = "auto", log_every: int = 1, title: str = "fasync train"):
        if style == "auto":
            style = "rich" if sys.stdout.isatty() else "plain"
        self.style = style
        self.log_every = log_every
        self.total = total_rollouts
        self.title = title
        self._live = None
        self._console = None

    def __enter__(self) -> "Progress":
        if self.style == "rich":
            from rich.console import Console
            from rich.live import Live

            self._console = Console()
            self._live = Live(self._render(None), console=self._console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def _render(self, record: Optional[dict]):
        from rich.table import Table

        table = Table(title=self.title, expand=False)
        for label, _, _ in _COLUMNS:
            table.add_column(label, justify="right")
        table.add_column("rollout", justify="right")
        if record is not None:
            table.add_row(*[_format(record, key, fmt) for _, key, fmt in _COLUMNS],
                          f"{record.get('rollout', 0) + 1}/{self.total}")
        return table

    def update(self, record: dict) -> None:
        if self.style == "none":
            return
        if self.style == "rich":
            self._live.update(self._render(record))
        elif record.get("step", 0) % self.log_every == 0:
            print(format_line(record), flush=True)

    def message(self, text: str) -> None:
        if self.style == "rich":
            self._console.print(text)
        elif self.style != "none":
            print(text, flush=True)
