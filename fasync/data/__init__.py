"""Prompts, labels and rewards (no torch here: the check path may import it).

For any caller with a `data` and a `reward` section (an eval set too): `load_records(data_cfg, tokenizer,
context)` is the checked prompt pool, and `fasync.data.scoring.RewardRunner(reward_cfg).score(items, wheres)` scores
`RewardInput`s the way training does."""

from fasync.data.datasets import PromptDataset, build_dataset, load_records
from fasync.data.rewards import RewardInput, build_reward
from fasync.data.tasks import Problem
from fasync.errors import ConfigurationError

__all__ = ["ConfigurationError", "Problem", "PromptDataset", "RewardInput", "build_dataset", "build_reward",
           "load_records"]
