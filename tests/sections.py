"""Building small test configs: a base of sections, with some keys of some sections changed."""

from __future__ import annotations


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
