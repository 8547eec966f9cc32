"""The config's JSON Schema (draft-07), for editors to complete and validate config files."""

from __future__ import annotations

from typing import Any

DRAFT_07 = "http://json-schema.org/draft-07/schema#"
_EXTENDS = {
    "description": "Base config file(s), relative to this file, merged before it (mappings key by key, "
                   "lists replaced).",
    "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
}


def draft7_schema() -> dict:
    """pydantic's schema by alias, rewritten from draft 2020-12 constructs to draft-07 ones."""
    from fasync.config.schema import FasyncConfig

    schema = _draft7(FasyncConfig.model_json_schema(by_alias=True))
    definitions = schema.pop("$defs", {})
    schema["properties"] = {"extends": _EXTENDS, **schema["properties"]}
    return {"$schema": DRAFT_07, "title": "fasync config", **schema, "definitions": definitions}


def _draft7(node: Any) -> Any:
    if isinstance(node, list):
        return [_draft7(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _draft7(value) for key, value in node.items()}
    if "prefixItems" in out:  # tuples: draft-07 spells positional items as an `items` list
        out["items"] = out.pop("prefixItems")
        out["additionalItems"] = False
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        out["$ref"] = "#/definitions/" + ref[len("#/$defs/"):]
        if len(out) > 1:  # draft-07 ignores keywords next to $ref: keep the description visible
            out = {"allOf": [{"$ref": out.pop("$ref")}], **out}
    return out
