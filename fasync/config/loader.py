"""Loading a config: `extends` layers, command-line overrides, interpolation, validation.

Order: the bases named by `extends` (recursively, in list order), then the file itself, then
the overrides. Mappings merge key by key; any other value (lists included) replaces the earlier
one. Every problem is a located `Diagnostic`; nothing here raises for a bad config.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fasync.config import problems
from fasync.config.problems import report
from fasync.config.provenance import CLI_FILE, KeyPath, Provenance, format_key
from fasync.config.schema import FasyncConfig
from fasync.config.schema_errors import validate
from fasync.config.yaml_source import Layer, read_layer
from fasync.diagnostics import Diagnostic, Location, Severity


@dataclass
class LoadResult:
    config: FasyncConfig | None
    """The validated config; None when any load diagnostic is an error."""
    diagnostics: list[Diagnostic]
    provenance: Provenance
    raw: dict = field(default_factory=dict)
    """The merged, interpolated plain data (what was validated)."""
    partial: FasyncConfig | None = None
    """When `config` is None: what did load, defaults for the rest and foreign keys mapped where the mapping is
    exact (fasync.config.schema_errors); the lint rules run on it."""
    assumed: dict[str, str] = field(default_factory=dict)
    """Keys whose value in `partial` is not the one written, and why."""


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> LoadResult:
    top = os.fspath(path)
    diagnostics: list[Diagnostic] = []
    provenance = Provenance(top)
    merged: dict = {}
    for layer in _layers(Path(top), top, (), None, diagnostics):
        _merge(merged, layer.data, layer.positions, provenance)
    for index, override in enumerate(overrides, start=1):
        _apply_override(merged, override, Location(CLI_FILE, index, 1), provenance, diagnostics)
    raw = _interpolate(merged, provenance, diagnostics)
    validation = validate(raw, provenance)
    diagnostics.extend(validation.diagnostics)
    config, partial = validation.config, validation.partial
    if config is not None and any(d.severity is Severity.ERROR for d in diagnostics):
        config, partial = None, config  # it validates, but a layer had a problem (a base, a duplicate key, ...)
    if not Path(top).is_file() or any(d.code in _UNREADABLE and d.location and d.location.file == top
                                      for d in diagnostics):
        partial = None  # the file itself could not be read: there is nothing of it to lint
    return LoadResult(config, diagnostics, provenance, raw, partial, validation.assumed)


_UNREADABLE = {problems.YAML_SYNTAX, problems.NOT_A_MAPPING}


def _layers(path: Path, file: str, chain: tuple[tuple[Path, str], ...], named_at: Location | None,
            diagnostics: list[Diagnostic]) -> list[Layer]:
    """This file's bases (depth first, in order) followed by the file itself."""
    resolved = path.resolve()
    if any(resolved == seen for seen, _ in chain):
        loop = " → ".join([name for _, name in chain] + [file])
        diagnostics.append(report(problems.EXTENDS_CYCLE, f"`extends` cycle: {loop}", named_at,
                                  help="remove the `extends` entry that points back", key="extends"))
        return []
    layer, found = read_layer(path, file, named_at)
    diagnostics.extend(found)
    if layer is None:
        return []
    layers: list[Layer] = []
    for base, location in _bases(layer, diagnostics):
        base_file = os.path.normpath(os.path.join(os.path.dirname(file), base))
        layers += _layers(path.parent / base, base_file, chain + ((resolved, file),), location, diagnostics)
    return layers + [layer]


def _bases(layer: Layer, diagnostics: list[Diagnostic]) -> list[tuple[str, Location]]:
    """Remove `extends` from the layer; return the base paths with where each was written."""
    if "extends" not in layer.data:
        return []
    value = layer.data.pop("extends")
    key_location = layer.positions.pop(("extends",))
    item_locations = {p[1]: layer.positions.pop(p) for p in list(layer.positions) if p[:1] == ("extends",)}
    if value is None:
        return []
    entries = [(value, key_location)] if isinstance(value, str) else (
        [(item, item_locations.get(i, key_location)) for i, item in enumerate(value)]
        if isinstance(value, list) else None)
    if entries is None or any(not isinstance(item, str) or not item for item, _ in entries):
        diagnostics.append(report(problems.INVALID_EXTENDS, "`extends` must be a path or a list of paths",
                                  key_location, help="e.g. `extends: base.yaml` or `extends: [a.yaml, b.yaml]`",
                                  key="extends"))
        return []
    return entries


def _merge(target: dict, source: dict, positions: dict[KeyPath, Location], provenance: Provenance,
           prefix: KeyPath = ()) -> None:
    for key, value in source.items():
        path = prefix + (key,)
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            provenance.mention(path, positions.get(path))
            _merge(target[key], value, positions, provenance, path)
        else:
            target[key] = value
            below = [path] + [path + sub for sub in _subpaths(value)]
            provenance.replace(path, {p: positions[p] for p in below if p in positions})


def _apply_override(merged: dict, override: str, location: Location, provenance: Provenance,
                    diagnostics: list[Diagnostic]) -> None:
    key, _, text = override.partition("=")
    # Hydra's spellings: `+key=value` adds a key, `++key=value` forces it, `~key` deletes it.
    key = key.strip()
    if key.startswith("~"):
        _delete(merged, key[1:].split("."), provenance)
        return
    segments = key.lstrip("+").split(".")
    problem = None
    if not all(segments):
        problem = f"`{override}`: the key has an empty segment"
    else:
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            problem = f"`{override}`: the value is not valid YAML ({str(exc).splitlines()[0]})"
    if problem is not None:
        diagnostics.append(report(problems.INVALID_OVERRIDE, problem, location,
                                  help="write overrides as dotted.key=value, e.g. train.lr=1e-4"))
        return
    value = _plain_tree(value)
    path = tuple(segments)
    nested: Any = value
    for segment in reversed(segments):
        nested = {segment: nested}
    positions = {path[:end]: location for end in range(1, len(path) + 1)}
    positions.update({path + sub: location for sub in _subpaths(value)})
    _merge(merged, nested, positions, provenance)


def _delete(merged: dict, segments: list[str], provenance: Provenance) -> None:
    node = merged
    for segment in segments[:-1]:
        node = node.get(segment) if isinstance(node, dict) else None
    if isinstance(node, dict) and node.pop(segments[-1], None) is not None:
        provenance.replace(tuple(segments), {})


def _plain_tree(value: Any) -> Any:
    """YAML-typed override values, with non-string keys turned into strings like file keys are."""
    if isinstance(value, dict):
        return {str(k): _plain_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_tree(v) for v in value]
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def _subpaths(value: Any, prefix: KeyPath = ()) -> list[KeyPath]:
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    paths: list[KeyPath] = []
    for key, child in items:
        paths.append(prefix + (key,))
        paths += _subpaths(child, prefix + (key,))
    return paths


def _interpolated_paths(value: Any, prefix: KeyPath = ()) -> list[KeyPath]:
    if isinstance(value, str):
        return [prefix] if "${" in value else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [p for key, child in items for p in _interpolated_paths(child, prefix + (key,))]


def _interpolate(merged: dict, provenance: Provenance, diagnostics: list[Diagnostic]) -> dict:
    """Resolve `${...}` with OmegaConf (imported only when some value needs it); defaults can be referenced."""
    paths = _interpolated_paths(merged)
    if not paths:
        return merged
    from omegaconf import OmegaConf

    resolved = copy.deepcopy(merged)
    with_defaults = FasyncConfig().model_dump(by_alias=True, mode="json")
    _merge(with_defaults, copy.deepcopy(merged), {}, Provenance(""))
    try:
        tree = OmegaConf.create(with_defaults)
    except Exception as exc:  # noqa: BLE001 - OmegaConf rejects some trees with assorted exception types
        diagnostics.append(report(problems.BAD_INTERPOLATION, f"cannot interpolate this config: {_first_line(exc)}",
                                  provenance.origin(paths[0]), key=format_key(paths[0])))
        return resolved
    for path in paths:
        try:
            node = tree
            for segment in path:
                node = node[segment]
            value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        except Exception as exc:  # noqa: BLE001 - resolvers (oc.env, oc.decode, ...) raise assorted errors
            diagnostics.append(report(
                problems.BAD_INTERPOLATION, f"`{format_key(path)}`: cannot resolve "
                f"{_get(merged, path)!r}: {_first_line(exc)}", provenance.origin(path),
                help="interpolations name a key of the merged config (`${train.lr}`) or an environment "
                "variable (`${oc.env:VAR,default}`)", key=format_key(path)))
            _drop(resolved, path)
            continue
        _set(resolved, path, value)
    return resolved


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _get(tree: Any, path: KeyPath) -> Any:
    for segment in path:
        tree = tree[segment]
    return tree


def _set(tree: Any, path: KeyPath, value: Any) -> None:
    _get(tree, path[:-1])[path[-1]] = value


def _drop(tree: Any, path: KeyPath) -> None:
    """Forget an unresolvable value so that the key falls back to its default (a list item becomes null)."""
    parent = _get(tree, path[:-1])
    if isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = None
