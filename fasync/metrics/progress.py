"""The live display: a rich panel on a terminal, plain lines otherwise. The rich panel keeps the run's reward
history (one mark per rollout) and, at --verbose, shows the latest generation."""

from __future__ import annotations

import sys
from collections import deque
from typing import Optional

STEPS_TAKEN = "steps_taken"
"""The step column counts the optimizer steps taken, as the summary's "at optimizer step N" does: a row's
`step` (metrics.jsonl) counts from 0."""
REWARD_HISTORY = 60
"""Rollouts the rich panel's reward history shows, the newest last."""
SPARKS = "▁▂▃▄▅▆▇█"
SAMPLE_CHARS = 160
"""The most characters of a prompt or completion the display shows (samples.jsonl keeps them whole)."""

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


def sparkline(values: list[float]) -> str:
    """One mark per value, scaled between the values' minimum and maximum (all alike: the lowest mark)."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = high - low
    return "".join(SPARKS[round((value - low) / span * (len(SPARKS) - 1)) if span > 0 else 0] for value in values)


def _clip(text: str) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= SAMPLE_CHARS else text[: SAMPLE_CHARS - 1] + "…"


def format_sample(sample: dict) -> str:
    """A samples.jsonl line (fasync.metrics.samples) in one line: prompt → completion, reward and label."""
    return (f"sample (step {sample['step']}, version {sample['version']}): {_clip(sample['prompt'])!r} → "
            f"{_clip(sample['completion'])!r}  reward {sample['reward']:.3g}  label {_clip(sample['label'])!r}")


class Progress:
    """Shows each optimizer step's key metrics; `style` is logging.progress."""

    def __init__(self, total_rollouts: int, style: str = "auto", log_every: int = 1, title: str = "fasync train",
                 verbose: bool = False):
        if style == "auto":
            style = "rich" if sys.stdout.isatty() else "plain"
        self.style = style
        self.verbose = verbose
        """Show the latest generation (`sample`) too."""
        self.rewards: deque[float] = deque(maxlen=REWARD_HISTORY)
        """The mean reward of each rollout (drain) so far, the newest last."""
        self.latest_sample: Optional[dict] = None
        self._record: Optional[dict] = None
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
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        table = Table(title=self.title, expand=False)
        for label, _, _ in _COLUMNS:
            table.add_column(label, justify="right")
        table.add_column("rollout", justify="right")
        if record is not None:
            table.add_row(*[_format(record, key, fmt) for _, key, fmt in _COLUMNS],
                          f"{record.get('rollout', 0) + 1}/{self.total}")
        parts = [table]
        if self.rewards:
            parts.append(Text(f"reward history ({min(self.rewards):.3f} … {max(self.rewards):.3f}): "
                              f"{sparkline(list(self.rewards))}"))
        if self.verbose and self.latest_sample is not None:
            parts.append(Text(format_sample(self.latest_sample), overflow="fold"))
        return Group(*parts)

    def update(self, record: dict) -> None:
        if self.style == "none":
            return
        if "rollout_reward_mean" in record and (self._record is None or
                                                self._record.get("rollout") != record.get("rollout")):
            self.rewards.append(record["rollout_reward_mean"])
        self._record = record
        if self.style == "rich":
            self._live.update(self._render(record))
        elif record.get("step", 0) % self.log_every == 0:
            print(format_line(record), flush=True)

    def sample(self, sample: dict) -> None:
        """At --verbose, show `sample` (a samples.jsonl line) as the latest generation."""
        if not self.verbose or self.style == "none":
            return
        self.latest_sample = sample
        if self.style == "rich":
            self._live.update(self._render(self._record))
        else:
            print(format_sample(sample), flush=True)

    def message(self, text: str) -> None:
        if self.style == "rich":
            self._console.print(text)
        elif self.style != "none":
            print(text, flush=True)
