"""Validation: pydantic's errors as located diagnostics, one per error."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from fasync.config import problems
from fasync.config.fields import default_value, field_at, iter_fields, section_fields, show_value
from fasync.config.foreign_keys import describe, migration_for, normalize
from fasync.config.problems import report
from fasync.config.provenance import KeyPath, Provenance, format_key
from fasync.config.schema import FasyncConfig
from fasync.diagnostics import Diagnostic

_FIELD_NAMES = {path[-1] for path, _ in iter_fields()}


def validate(raw: dict, provenance: Provenance) -> tuple[FasyncConfig | None, list[Diagnostic]]:
    try:
        return FasyncConfig.model_validate(raw), []
    except ValidationError as exc:
        return None, [d for e in exc.errors(include_url=False) for d in _diagnostics(e, raw, provenance)]


def _diagnostics(error: dict, raw: dict, provenance: Provenance) -> Iterator[Diagnostic]:
    loc = tuple(error["loc"])
    if error["type"] == "extra_forbidden":
        yield _unknown_key(loc, provenance)
        yield from _foreign_keys_within(error["input"], loc, provenance)
        return
    path = _present_prefix(raw, loc)
    key = format_key(path) if path else None
    message = error["msg"].removeprefix("Value error, ")
    value = error.get("input")
    if not isinstance(value, (dict, list)) and path == loc:
        message += f" (got {_short(value)})"
    yield report(problems.INVALID_VALUE, f"`{key}`: {message}" if key else message, provenance.origin(path),
                 help=_field_help(path), key=key)


def _present_prefix(raw: Any, loc: tuple) -> KeyPath:
    """The longest prefix of a pydantic location that names a value in the input."""
    path: list = []
    for segment in loc:
        if isinstance(raw, dict) and segment in raw or isinstance(raw, list) and isinstance(segment, int) \
                and 0 <= segment < len(raw):
            raw = raw[segment]
            path.append(segment)
        else:
            break
    return tuple(path)


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


def _unknown_key(path: KeyPath, provenance: Provenance) -> Diagnostic:
    key = format_key(path)
    migration = migration_for(str(path[-1]))
    if migration is not None:
        message, help = describe(key, migration)
        return report(problems.FOREIGN_KEY, message, provenance.origin(path), help=help, key=key)
    return report(problems.UNKNOWN_KEY, f"unknown key `{key}`", provenance.origin(path),
                  help=_suggestion(path), key=key)


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


def _foreign_keys_within(value: Any, prefix: KeyPath, provenance: Provenance) -> Iterator[Diagnostic]:
    """Inside an unknown mapping (e.g. verl's `actor_rollout_ref`), point at each foreign key we can translate.

    Keys that fasync itself has (a misspelt section's content) are left to the section's own diagnostic.
    """
    if not isinstance(value, dict):
        return
    for name, child in value.items():
        path = prefix + (name,)
        migration = migration_for(str(name))
        if migration is not None and normalize(str(name)) not in _FIELD_NAMES:
            message, help = describe(format_key(path), migration)
            yield report(problems.FOREIGN_KEY, message, provenance.origin(path), help=help, key=format_key(path))
        yield from _foreign_keys_within(child, path, provenance)
