"""Checks Grafana dashboard JSON files against Grafana's published dashboard schema.

The schema is Grafana's own, as grafana-foundation-sdk publishes it: Python models
generated from Grafana's schemas (the dashboard, each panel plugin's options and field
config, each data source's query), for the Grafana version the compose stack runs.
tools/grafana/requirements.txt pins it; scripts/ensure-grafana-sdk installs it into
.tools/grafana-sdk, whose Python runs this script (tests/project/test_dashboard.py):

    .tools/grafana-sdk/bin/python tools/grafana/check_dashboard.py FILE...

The SDK decodes a dashboard without judging it (it drops what it does not know, and
keeps values of any type), so the judging is here, against its models:

- every panel's type is a panel plugin of the schema, every query one of a data source
  of the schema (decoded by its model, not kept as an unknown bag);
- every value has the type its field declares (enums and literals included);
- every field the schema requires is given;
- nothing is outside the schema: the decoded dashboard, written back, holds every key
  and value of the file (a misspelt or unknown key is dropped by the decoder).

Prints `FILE: PROBLEM` for each problem found and exits 1 if there was any.
"""

from __future__ import annotations

import enum
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog import runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

MODELS = "grafana_foundation_sdk.models."


def conforms(value: Any, hint: Any) -> bool:  # noqa: PLR0911 -- one answer per kind of hint
    """Whether `value`, as decoded, has the declared type `hint`."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any or hint is object:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in args
    if origin is list:
        return isinstance(value, list) and all(conforms(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            isinstance(k, str) and conforms(v, args[1]) for k, v in value.items()
        )
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        # The decoder keeps an enum field's raw value: it must be one of the enum's.
        return isinstance(value, hint) or value in {member.value for member in hint}
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a hint this checker does not know: not judged


def is_model(value: Any) -> bool:
    return type(value).__module__.startswith(MODELS) or isinstance(value, runtime.UnknownDataquery)


def json_key(model: Any, attribute: str) -> str:
    """The JSON key of a model's attribute, as its own to_json writes it."""
    written = model.to_json()
    for key in written:
        if key.replace("_", "").lower() == attribute.removesuffix("_val").replace("_", "").lower():
            return str(key)
    return attribute


def type_problems(model: Any, raw: Any, path: str) -> list[str]:
    """Problems of a decoded model: values of the wrong type, required fields missing
    from `raw` (the JSON it was decoded from, where the path has one)."""
    if isinstance(model, runtime.UnknownDataquery):
        return [f"{path}: a query of no data source the schema knows"]
    problems = []
    hints = typing.get_type_hints(type(model))
    for attribute, hint in hints.items():
        value, key = getattr(model, attribute, None), json_key(model, attribute)
        if not conforms(value, hint):
            problems.append(f"{path}.{key}: {value!r} is not {hint}")
        required = type(None) not in typing.get_args(hint)
        if required and isinstance(raw, dict) and key not in raw:
            problems.append(f"{path}: {key!r} is required")
        problems += nested_problems(value, child(raw, key), f"{path}.{key}")
    return problems


def child(raw: Any, key: str | int) -> Any:
    if isinstance(raw, dict) and isinstance(key, str):
        return raw.get(key)
    if isinstance(raw, list) and isinstance(key, int) and key < len(raw):
        return raw[key]
    return None


def nested_problems(value: Any, raw: Any, path: str) -> list[str]:
    if is_model(value):
        return type_problems(value, raw, path)
    if isinstance(value, list):
        return [
            p
            for i, v in enumerate(value)
            for p in nested_problems(v, child(raw, i), f"{path}[{i}]")
        ]
    if isinstance(value, dict):
        return [
            p for k, v in value.items() for p in nested_problems(v, child(raw, k), f"{path}.{k}")
        ]
    return []


def dropped(given: Any, kept: Any, path: str) -> list[str]:
    """What of `given` (the file) is not in `kept` (the decoded dashboard written back)."""
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            return [f"{path}: not an object in the schema"]
        problems = []
        for key, value in given.items():
            if key not in kept:
                problems.append(f"{path}.{key}: not in the schema")
            else:
                problems += dropped(value, kept[key], f"{path}.{key}")
        return problems
    if isinstance(given, list):
        if not isinstance(kept, list) or len(kept) != len(given):
            return [f"{path}: not a list in the schema"]
        return [
            p
            for i, (g, k) in enumerate(zip(given, kept, strict=True))
            for p in dropped(g, k, f"{path}[{i}]")
        ]
    return [] if given == kept else [f"{path}: {given!r} reads back as {kept!r}"]


def check(data: Any) -> list[str]:
    if not isinstance(data, dict):
        return ["$: a dashboard is a JSON object"]
    try:
        dashboard = Dashboard.from_json(data)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        return [f"$: does not decode as a dashboard: {type(exc).__name__}: {exc}"]
    problems = []
    for i, panel in enumerate(data.get("panels") or []):
        kind = panel.get("type") if isinstance(panel, dict) else None
        if kind != "row" and runtime.panelcfg_config(str(kind)) is None:
            problems.append(f"$.panels[{i}].type: {kind!r} is no panel plugin of the schema")
    problems += type_problems(dashboard, data, "$")
    written = json.loads(json.dumps(dashboard, cls=JSONEncoder))
    problems += dropped(data, written, "$")
    return problems


def main(paths: list[str]) -> int:
    register_default_plugins()
    failed = False
    for path in paths:
        for problem in check(json.loads(Path(path).read_text(encoding="utf-8"))):
            print(f"{path}: {problem}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
