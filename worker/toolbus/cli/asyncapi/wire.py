"""Our wire models' schemas as AsyncAPI component schemas.

The payloads are exactly `schemas/*.json` (rendered by `toolbus.wire.contracts`), with each
file's `$defs` moved up into `components/schemas`: inside an AsyncAPI document a schema's
`#/...` reference resolves against the whole document, not against the schema. The
`$schema` and `$id` keys go too, since an `$id` inside a document would change what its
schemas' references resolve against.
"""

from __future__ import annotations

import json
from typing import Any

from toolbus.wire.contracts import WIRE_MODELS, render_schemas

COMPONENT_SCHEMAS = "#/components/schemas/"
_DEFS = "#/$defs/"


def wire_schemas() -> dict[str, Any]:
    """Component name (the model's, e.g. `Reply`) -> schema, every wire model and what it uses."""
    hoisted: dict[str, Any] = {}
    for file_name, text in render_schemas().items():
        schema = json.loads(text)
        for name, definition in schema.pop("$defs", {}).items():
            _put(hoisted, name, _rewritten(definition), file_name)
        for key in ("$schema", "$id"):
            schema.pop(key)
        _put(hoisted, schema["title"], _rewritten(schema), file_name)
    return dict(sorted(hoisted.items()))


def wire_ref(file_stem: str) -> dict[str, str]:
    """A reference to the component of `schemas/{file_stem}.json` (e.g. `calls-reply`)."""
    return {"$ref": COMPONENT_SCHEMAS + WIRE_MODELS[file_stem].__name__}


def _put(hoisted: dict[str, Any], name: str, schema: Any, file_name: str) -> None:
    # Two files that share a definition must agree on it, or one would silently win.
    if hoisted.setdefault(name, schema) != schema:
        raise ValueError(f"{file_name} defines `{name}` unlike another schema file")


def _rewritten(node: Any) -> Any:
    """`node` with every `#/$defs/X` reference pointing at `#/components/schemas/X`."""
    if isinstance(node, dict):
        return {
            key: COMPONENT_SCHEMAS + value.removeprefix(_DEFS)
            if key == "$ref" and isinstance(value, str) and value.startswith(_DEFS)
            else _rewritten(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rewritten(item) for item in node]
    return node
