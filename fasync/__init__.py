"""fasync: a launcher and linter for sync, async and fully-async RL post-training."""

__version__ = "0.1.0"
