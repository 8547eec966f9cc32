"""The mode benchmark: sync, async and fully_async on one config, against the ideal overlap, plus the
long-tail scenario; writes docs/benchmarks.md. The same as `fasync bench`:

    python bench/modes.py [CONFIG] [KEY=VALUE...] [--out DIR] [--no-write] [--no-long-tail]
"""

from __future__ import annotations

import sys

from fasync.cli import app

if __name__ == "__main__":
    app(["bench", *sys.argv[1:]], prog_name="python bench/modes.py")
