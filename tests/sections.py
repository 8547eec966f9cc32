"""Building small test configs: the tiny run every training test starts from, with some keys of some
sections changed."""

from __future__ import annotations

from fasync.config.schema import FasyncConfig

_TINY = {
    "model": {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 16},
    "data": {"task": "reverse", "length": 3},
    "reward": {"function": "partial_match"},
    "rollout": {"batch_size": 4, "n_samples_per_prompt": 4, "max_new_tokens": 4},
    "train": {"global_batch_size": 8, "micro_batch_size": 4, "num_rollouts": 4, "lr": 3e-3},
    "logging": {"progress": "none"},
}
"""A run that trains in seconds on one CPU: a one-layer model reversing three digits, two steps per rollout."""


def with_sections(base: dict, **sections) -> dict:
    """A copy of `base` where each keyword names a section whose keys are updated (a dict) or a
    top-level key that is replaced (anything else, e.g. `mode="async"`)."""
    raw = {key: dict(value) if isinstance(value, dict) else value for key, value in base.items()}
    for section, values in sections.items():
        if isinstance(values, dict):
            raw.setdefault(section, {}).update(values)
        else:
            raw[section] = values
    return raw


def tiny_sections(**sections) -> dict:
    """The tiny run's raw config (what a YAML file holds) with `sections` applied as `with_sections` does."""
    return with_sections(_TINY, **sections)


def tiny_config(**sections) -> FasyncConfig:
    """The tiny run's config with `sections` applied, validated."""
    return FasyncConfig.model_validate(tiny_sections(**sections))
