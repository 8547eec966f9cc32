"""Validation: pydantic's errors as located diagnostics, and the config that still loads around them.

A config with unknown, foreign or invalid keys is reported, and then validated again without them (defaults
in their place) and with the foreign keys whose fasync equivalent is exact, so that the lint rules can run
on everything that did load. Where such a config stands in for what was written is recorded as assumed.
A config pasted from another framework gets one grouped diagnostic instead of one per key.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from fasync.config import problems
from fasync.config.fields import default_value, field_at, iter_fields, section_fields
from fasync.config.problems import report
from fasync.config.provenance import KeyPath, Provenance, format_key
from fasync.config.schema import FasyncConfig
from fasync.diagnostics import Diagnostic, show_value
from fasync.frameworks import FRAMEWORKS, detect, foreign_key_hint, mappings_for, normalize
from fasync.frameworks.common import ADAPT, NONE, SAME, KeyMapping

_FIELD_NAMES = {path[-1] for path, _ in iter_fields()}
_SECTIONS = {path[0] for path, info in iter_fields() if len(path) == 1 and section_fields(path) is not None}
GROUP_AT = 6
"""Foreign keys from which a config is reported as one migration diagnostic, not one per key."""
_ATTEMPTS = 4


@dataclass
class Validation:
    config: FasyncConfig | None
    """The config as written; None when any key did not validate."""
    diagnostics: list[Diagnostic]
    partial: FasyncConfig | None = None
    """Without the keys that did not load (their defaults instead) and with the exactly mapped foreign keys."""
    assumed: dict[str, str] = field(default_factory=dict)
    """Key → why its value in `partial` is not the one written."""


def validate(raw: dict, provenance: Provenance) -> Validation:
    try:
        return Validation(FasyncConfig.model_validate(raw), [])
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    unknown = [_without_union_tags(raw, tuple(e["loc"])) for e in errors if e["type"] == "extra_forbidden"]
    invalid = _in_the_branch_written([e for e in errors if e["type"] != "extra_forbidden"], raw)
    diagnostics, mapped = _unknown_keys(raw, unknown, provenance)
    diagnostics += [d for e in invalid for d in _invalid_value(e, raw, provenance)]
    partial, assumed = _partial(raw, unknown, [_present_prefix(raw, tuple(e["loc"])) for e in invalid], mapped)
    return Validation(None, diagnostics, partial, assumed)


_OTHER_KIND = ("literal_error", "model_type", "model_attributes_type", "dict_type", "list_type", "string_type",
               "int_type", "int_parsing", "float_type", "float_parsing", "bool_type", "bool_parsing")
"""Errors that say only that a value is not of the kind one branch of a union takes."""


def _in_the_branch_written(errors: list[dict], raw: dict) -> list[dict]:
    """For a value that one branch of a union (`simulate.lengths`: a name, a list or {median, sigma}) takes in
    kind but not in content, only that branch's errors: that `sigma` is too large, not also that the value is
    neither 'data' nor a list."""
    unions: dict[KeyPath, list[tuple[str, dict]]] = {}
    for error in errors:
        loc = tuple(error["loc"])
        path = _present_prefix_as_written(raw, loc)
        if len(path) < len(loc):  # pydantic names a union's branch where the input has no key
            unions.setdefault(path, []).append((str(loc[len(path)]), error))
    dropped = []
    for branches in unions.values():
        about_content = [error for _, error in branches if error["type"] not in _OTHER_KIND]
        if len({branch for branch, _ in branches}) > 1 and about_content:
            dropped += [error for _, error in branches if error["type"] in _OTHER_KIND]
    return [error for error in errors if not any(error is d for d in dropped)]


def _present_prefix_as_written(raw: Any, loc: tuple) -> KeyPath:
    path: list = []
    for segment in loc:
        if not _holds(raw, segment):
            break
        raw = raw[segment]
        path.append(segment)
    return tuple(path)


def _invalid_value(error: dict, raw: dict, provenance: Provenance) -> Iterator[Diagnostic]:
    loc = tuple(error["loc"])
    path = _present_prefix(raw, loc)
    key = format_key(path) if path else None
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    if not isinstance(value, (dict, list)) and len(path) == len(_without_union_tags(raw, loc)):
        message += f" (got {_short(value)})"
    yield report(problems.INVALID_VALUE, f"`{key}`: {message}" if key else message, provenance.origin(path),
                 help=_field_help(path), key=key)


def _holds(value: Any, segment) -> bool:
    return isinstance(value, dict) and segment in value or isinstance(value, list) and isinstance(segment, int) \
        and 0 <= segment < len(value)


def _without_union_tags(raw: Any, loc: tuple) -> tuple:
    """A pydantic location without the names it gives a union's branches (`lengths.LengthTail.sigma` is
    `lengths.sigma` in the input)."""
    kept = []
    for index, segment in enumerate(loc):
        if not _holds(raw, segment) and index + 1 < len(loc) and _holds(raw, loc[index + 1]):
            continue
        kept.append(segment)
        raw = raw[segment] if _holds(raw, segment) else None
    return tuple(kept)


def _present_prefix(raw: Any, loc: tuple) -> KeyPath:
    """The longest prefix of a pydantic location that names a value in the input (a union's branch names
    left out)."""
    return _present_prefix_as_written(raw, _without_union_tags(raw, loc))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field_help(path: KeyPath) -> str | None:
    while path and isinstance(path[-1], int):  # an item of a list-valued field: describe the field
        path = path[:-1]
    info = field_at(path)
    if info is None:
        return None
    return f"{format_key(path)}: {info.description} Default: {show_value(default_value(info))}."


def _get(tree: Any, path: KeyPath) -> Any:
    for segment in path:
        tree = tree[segment]
    return tree


def _leaves(value: Any, path: KeyPath) -> list[tuple[KeyPath, Any]]:
    if isinstance(value, dict) and value:
        return [leaf for key, child in value.items() for leaf in _leaves(child, path + (key,))]
    return [(path, value)]


def _misspelt_section(path: KeyPath) -> bool:
    """`asynch.max_weight_staleness`: a fasync key under a misspelt section, left to the section's diagnostic."""
    return (len(path) > 1 and path[0] not in _SECTIONS and normalize(str(path[-1])) in _FIELD_NAMES
            and bool(difflib.get_close_matches(str(path[0]), sorted(_SECTIONS), n=1, cutoff=0.6)))


def _misplaced(path: KeyPath, rows: list[KeyMapping]) -> bool:
    """`lr`, `train.n_samples_per_prompt`, `shared.top_p`: a fasync key in the wrong place, which F006's
    `did you mean` names, unless another framework's table names more of its path than the key's name."""
    if normalize(str(path[-1])) not in _FIELD_NAMES:
        return False
    tail = tuple(normalize(str(p)) for p in path[-2:])
    if len(tail) == 2 and any(tuple(row.source.split("."))[-2:] == tail for row in rows):
        return False  # OpenRLHF's `train.batch_size`: the whole path is the other framework's key
    return len(path) == 1 or path[0] in _SECTIONS or all("." not in row.source for row in rows)


def _typo(path: KeyPath) -> str | None:
    """The fasync key an unknown key inside a fasync section most likely misspells."""
    if path[0] not in _SECTIONS:
        return None
    fields = section_fields(path[:-1]) or {}
    close = difflib.get_close_matches(normalize(str(path[-1])), list(fields), n=1, cutoff=0.6)
    return format_key(path[:-1] + (close[0],)) if close else None


def _unknown_keys(raw: dict, unknown: list[KeyPath], provenance: Provenance
                  ) -> tuple[list[Diagnostic], dict[KeyPath, tuple[Any, list[KeyMapping]]]]:
    """Diagnostics for the unknown keys, and the foreign leaves with their rows of the table."""
    leaves = [leaf for path in unknown for leaf in _leaves(_get(raw, path), path)]
    framework = detect([path for path, _ in leaves])
    foreign = {path: (value, rows) for path, value in leaves
               if (rows := mappings_for(path, framework)) and not _misspelt_section(path)
               and not _misplaced(path, rows)}
    if framework is not None and len(foreign) >= GROUP_AT:
        return _grouped(raw, unknown, leaves, foreign, framework, provenance), foreign
    out = []
    for path in unknown:
        within = [p for p in foreign if p[: len(path)] == path and p != path]
        if within:
            out += [_foreign(p, foreign[p][1], provenance) for p in within]
        elif path in foreign:
            out.append(_foreign(path, foreign[path][1], provenance))
        else:
            out.append(report(problems.UNKNOWN_KEY, f"unknown key `{format_key(path)}`", provenance.origin(path),
                              help=_suggestion(path), key=format_key(path)))
    return out, foreign


def _foreign(path: KeyPath, rows: list[KeyMapping], provenance: Provenance) -> Diagnostic:
    message, help = foreign_key_hint(format_key(path), rows)
    return report(problems.FOREIGN_KEY, message, provenance.origin(path), help=help, key=format_key(path))


def _grouped(raw: dict, unknown: list[KeyPath], leaves: list[tuple[KeyPath, Any]],
             foreign: dict[KeyPath, tuple[Any, list[KeyMapping]]], framework: str, provenance: Provenance
             ) -> list[Diagnostic]:
    """One diagnostic for a config written for another framework, plus the likely typos of fasync keys."""
    typos = [path for path, _ in leaves if path not in foreign and _typo(path)]
    exact, converted, adapt, missing = [], [], [], []
    for path, _ in leaves:
        if path in typos:
            continue
        rows = foreign[path][1] if path in foreign else ()
        kinds = {row.kind for row in rows}
        targets = list(dict.fromkeys(t for row in rows for t in row.targets))
        if not rows or kinds == {NONE}:
            missing.append(f"`{format_key(path)}`")
        elif kinds == {SAME}:
            exact.append(f"`{format_key(path)}` → {', '.join(f'`{t}`' for t in targets)}")
        elif kinds == {ADAPT}:
            adapt.append(f"`{format_key(path)}` → {', '.join(f'`{t}`' for t in targets)}")
        else:
            notes = " ".join(dict.fromkeys(row.note for row in rows if row.note))
            converted.append(f"`{format_key(path)}` → {', '.join(f'`{t}`' for t in targets)} ({notes})")
    name = FRAMEWORKS[framework].display
    variant = " fully-async" if any(p[0] in ("async_training", "fully_async") for p, _ in leaves) else ""
    parts = [f"the same value: {'; '.join(exact)}" if exact else "",
             f"converted: {'; '.join(converted)}" if converted else "",
             f"no equivalent: {', '.join(missing)}" if missing else "",
             f"a function of {name}'s own signature, to adapt (docs/migrate.md): "
             f"{'; '.join(adapt)}" if adapt else "",
             f"`fasync import {framework} FILE -o fasync.yaml` converts every key, the arithmetic in a comment; the "
             "lint rules ran on the rest of this config with the keys of the first group (marked `assumed`) and "
             "defaults for the others"]
    first = min((path for path, _ in leaves), key=lambda p: _position(provenance, p))
    message = (f"this looks like a {name}{variant} config: {len(exact) + len(converted)} keys map to fasync keys "
               f"({len(exact)} with the same value, {len(converted)} converted), {len(missing)} have no equivalent"
               + (f", {len(adapt)} name a function to adapt" if adapt else ""))
    out = [report(problems.FOREIGN_KEY, message, provenance.origin(first), help="\n  ".join(p for p in parts if p))]
    out += [report(problems.UNKNOWN_KEY, f"unknown key `{format_key(path)}`", provenance.origin(path),
                   help=f"did you mean `{_typo(path)}`?", key=format_key(path)) for path in typos]
    return out


def _position(provenance: Provenance, path: KeyPath) -> tuple:
    where = provenance.origin(path)
    return where.file, where.line, where.column


def _suggestion(path: KeyPath) -> str:
    name, parent = normalize(str(path[-1])), path[:-1]
    elsewhere = [p for p, _ in iter_fields() if p[-1] == name and p[:-1] != parent]
    if elsewhere:
        return "did you mean " + " or ".join(f"`{format_key(p)}`" for p in elsewhere) + "?"
    fields = section_fields(parent) or {}
    close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.6)
    if close:
        return f"did you mean `{format_key(parent + (close[0],))}`?"
    where = f"`{format_key(parent)}`" if parent else "the top level"
    return f"valid keys in {where}: {', '.join(fields)}"


def _partial(raw: dict, unknown: list[KeyPath], invalid: list[KeyPath],
             foreign: dict[KeyPath, tuple[Any, list[KeyMapping]]]) -> tuple[FasyncConfig | None, dict[str, str]]:
    """The config without the keys that did not load, with the foreign keys whose mapping is exact."""
    data = copy.deepcopy(raw)
    assumed: dict[str, str] = {}
    for path in invalid:
        assumed[format_key(path)] = "at its default: the value written did not load"
    for path in unknown:
        typo = _typo(path)
        if typo is not None:
            assumed[typo] = f"at its default: `{format_key(path)}` was written instead"
    for path in unknown + invalid:
        _drop(data, path)
    for path, (value, rows) in foreign.items():
        if {row.kind for row in rows} != {SAME}:
            continue
        for target in dict.fromkeys(t for row in rows for t in row.targets):
            section, name = target.split(".")
            if name in data.get(section, {}) or format_key((section, name)) in assumed:
                continue
            data.setdefault(section, {})[name] = value
            assumed[target] = f"{show_value(value)} from {rows[0].display}'s `{format_key(path)}`"
    for _ in range(_ATTEMPTS):
        try:
            return FasyncConfig.model_validate(data), assumed
        except ValidationError as exc:
            for error in exc.errors(include_url=False):
                path = _present_prefix(data, tuple(error["loc"]))
                assumed[format_key(path)] = "at its default: the value did not load"
                if not _drop(data, path):
                    return None, assumed
    return None, assumed


def _drop(data: dict, path: KeyPath) -> bool:
    """Remove the value at `path` (a whole top-level entry for a list item); False when there is nothing."""
    path = path[:1] if any(isinstance(p, int) for p in path) else path
    if not path:
        return False
    try:
        parent = _get(data, path[:-1])
    except (KeyError, IndexError, TypeError):
        return False
    if isinstance(parent, dict) and path[-1] in parent:
        del parent[path[-1]]
        return True
    return False
