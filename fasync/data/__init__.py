"""Prompts, labels and rewards (no torch here: the check path may import it)."""

from fasync.data.datasets import PromptDataset, build_dataset
from fasync.data.rewards import build_reward
from fasync.data.tasks import Problem
from fasync.errors import ConfigurationError

__all__ = ["ConfigurationError", "Problem", "PromptDataset", "build_dataset", "build_reward"]
