"""The training modes, defined once: the schema's `mode`, the metric registry, the linter's facts, the
simulator, the benchmark and the docs take them from here.

- `sync`: generate a rollout, then train on it;
- `async`: the next rollout is generated while this one trains (overlapped, batch-level);
- `fully_async`: generation streams samples that the trainer drains (streaming, sample-level).
"""

from __future__ import annotations

from typing import Literal, get_args

Mode = Literal["sync", "async", "fully_async"]

MODES: tuple[Mode, ...] = get_args(Mode)
"""Every mode, in the order the docs, the simulator and the benchmark list them."""

ASYNC_MODES: tuple[Mode, ...] = ("async", "fully_async")
"""The modes whose generation overlaps training, so that older weights may have generated a sample."""
