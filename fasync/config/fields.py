"""Walking the schema by key path (the YAML spelling: aliases, e.g. `async`)."""

from __future__ import annotations

import typing
from collections.abc import Iterator

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from fasync.config.provenance import KeyPath
from fasync.config.schema import FasyncConfig


def flatten(data, prefix: str = "") -> dict:
    """Nested mappings as dotted key → leaf value (`{"train": {"lr": 1}}` → `{"train.lr": 1}`)."""
    if isinstance(data, dict):
        out: dict = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def key_name(name: str, info: FieldInfo) -> str:
    return info.alias or name


def section_model(annotation) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _mapping_model(annotation) -> type[BaseModel] | None:
    """The model of a section, or of a union's one mapping form (`simulate.lengths: {median, sigma}`)."""
    found = section_model(annotation)
    if found is None and typing.get_origin(annotation) is typing.Union:
        models = [model for member in typing.get_args(annotation) if (model := section_model(member))]
        found = models[0] if len(models) == 1 else None
    return found


def section_fields(path: KeyPath, model: type[BaseModel] = FasyncConfig) -> dict[str, FieldInfo] | None:
    """The fields of the section (or mapping value) at `path` by key name; None when `path` is neither."""
    for key in path:
        info = section_fields((), model).get(key) if isinstance(key, str) else None
        model = _mapping_model(info.annotation) if info is not None else None
        if model is None:
            return None
    return {key_name(name, info): info for name, info in model.model_fields.items()}


def field_at(path: KeyPath) -> FieldInfo | None:
    if not path:
        return None
    fields = section_fields(path[:-1])
    return fields.get(path[-1]) if fields is not None and isinstance(path[-1], str) else None


def iter_fields(model: type[BaseModel] = FasyncConfig, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, FieldInfo]]:
    """Every field, sections before their keys, in declaration order."""
    for name, info in model.model_fields.items():
        path = prefix + (key_name(name, info),)
        yield path, info
        section = section_model(info.annotation)
        if section is not None:
            yield from iter_fields(section, path)


def leaf_paths() -> list[KeyPath]:
    return [path for path, info in iter_fields() if section_model(info.annotation) is None]


def default_value(info: FieldInfo):
    """The field's default as plain data (sections dumped by alias)."""
    value = info.get_default(call_default_factory=True)
    return value.model_dump(by_alias=True, mode="json") if isinstance(value, BaseModel) else value
