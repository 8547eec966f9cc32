"""`fasync config show`: the resolved config, where each value came from, and the derived quantities."""

from __future__ import annotations

import json
from typing import Any

from fasync.config.derived import Derived
from fasync.config.loader import LoadResult
from fasync.config.provenance import KeyPath, format_key
from fasync.diagnostics import show_value

SHOW_FORMATS = ("text", "yaml", "json")


def _leaves(value: Any, prefix: KeyPath = ()) -> list[tuple[KeyPath, Any]]:
    if isinstance(value, dict):
        return [leaf for key, child in value.items() for leaf in _leaves(child, prefix + (key,))]
    return [(prefix, value)]


def resolved(result: LoadResult, derived: Derived) -> dict:
    """{config, origins, derived} for a loaded config and its `derived` quantities; an origin is `file:line` or
    `default`."""
    config = result.config.model_dump(by_alias=True, mode="json")
    origins = {}
    for path, _ in _leaves(config):
        setter = result.provenance.setter(path)
        origins[format_key(path)] = f"{setter.file}:{setter.line}" if setter else "default"
    lag = derived.max_lag
    # The lag is counted in optimizer steps; versions are the same figure in the unit the bound is written in.
    return {"config": config, "origins": origins,
            "derived": {**derived.as_dict(), "max_lag": {"steps": lag.steps, "versions": lag.versions,
                                                         "steps_per_version": lag.steps_per_version}}}


def show(result: LoadResult, derived: Derived, fmt: str = "text") -> str:
    """`result`'s config and its `derived` quantities (`fasync.memory.derive_with_model`: the strategy's default
    follows from the model's size) in `fmt`."""
    if fmt not in SHOW_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(SHOW_FORMATS)}")
    data = resolved(result, derived)
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False)
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip()
    rows = [(key, show_value(value), data["origins"][key]) for key, value in
            ((format_key(p), v) for p, v in _leaves(data["config"]))]
    lag_text = derived.max_lag.steps_and_versions()
    derived = [(name, lag_text if name == "max_lag" else show_value(value), "")
               for name, value in data["derived"].items()]
    key_width = max(len(r[0]) for r in rows + derived)
    value_width = max(len(r[1]) for r in rows + derived)

    def table(entries):
        return "\n".join(f"{k:<{key_width}}  {v:<{value_width}}  {o}".rstrip() for k, v, o in entries)

    return (f"# {result.provenance.top_file}, resolved (value, then where it was set)\n{table(rows)}\n\n"
            f"# derived\n{table(derived)}")
