"""Property-based tests: random schemas, arguments respelled at random, normalized back exactly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from toolbus.normalization.normalize import Normalizer
from toolbus.tools.context import DETACHED, CallContext
from toolbus.tools.registry import Tool
from toolbus.tools.shapes import spelling_key
from toolbus.wire.contracts import ToolResult

WORDS = [
    "device",
    "name",
    "level",
    "room",
    "target",
    "value",
    "mode",
    "user",
    "count",
    "zone",
    "light",
]


def camel(words: tuple[str, ...]) -> str:
    return words[0] + "".join(w.title() for w in words[1:])


# One type for every style: the lambdas would otherwise make each call an untyped one.
STYLES: dict[str, Callable[[tuple[str, ...]], str]] = {
    "camel": camel,
    "snake": "_".join,
    "pascal": lambda w: "".join(x.title() for x in w),
    "kebab": "-".join,
    "upper": lambda w: "_".join(w).upper(),
}

# What one argument holds in these schemas: a nested object, a list of them, or a scalar.
Value = dict[str, Any] | list[dict[str, Any]] | int | str

names = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3, unique=True).map(tuple)


@st.composite
def object_schemas(
    draw: st.DrawFn, depth: int = 0
) -> tuple[dict[str, Any], dict[tuple[str, ...], Any]]:
    """A schema with camelCase properties, and the word tuples behind each property."""
    chosen = draw(
        st.lists(names, min_size=1, max_size=4, unique_by=lambda w: spelling_key("".join(w)))
    )
    properties: dict[str, Any] = {}
    kinds: dict[tuple[str, ...], Any] = {}
    for words in chosen:
        options = ["string", "integer"] if depth >= 2 else ["string", "integer", "object", "array"]
        kind = draw(st.sampled_from(options))
        if kind == "object":
            sub, sub_kinds = draw(object_schemas(depth + 1))
            properties[camel(words)] = sub
            kinds[words] = ("object", sub_kinds)
        elif kind == "array":
            sub, sub_kinds = draw(object_schemas(depth + 1))
            properties[camel(words)] = {"type": "array", "items": sub}
            kinds[words] = ("array", sub_kinds)
        else:
            properties[camel(words)] = {"type": kind}
            kinds[words] = (kind, None)
    return {"type": "object", "properties": properties}, kinds


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], int]:
    """(schema, canonical arguments, respelled arguments, number of keys respelled)."""
    schema, kinds = draw(object_schemas())
    respelled_count = 0

    def values(kinds: dict[tuple[str, ...], Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        nonlocal respelled_count
        canonical: dict[str, Any] = {}
        respelled: dict[str, Any] = {}
        for words, (kind, sub) in kinds.items():
            if not draw(st.booleans()):
                continue  # optional: leave some out
            c: Value  # canonical
            r: Value  # respelled
            if kind == "object":
                c, r = values(sub)
            elif kind == "array":
                pairs = [values(sub) for _ in range(draw(st.integers(0, 2)))]
                c, r = [p[0] for p in pairs], [p[1] for p in pairs]
            elif kind == "integer":
                c = r = draw(st.integers(-5, 5))
            else:
                # Values that look like keys must survive untouched.
                c = r = draw(st.sampled_from(["x", "device_name", "DeviceName", "value-mode", ""]))
            key = STYLES[draw(st.sampled_from(sorted(STYLES)))](words)
            respelled_count += key != camel(words)
            canonical[camel(words)] = c
            respelled[key] = r
        return canonical, respelled

    canonical, respelled = values(kinds)
    return schema, canonical, respelled, respelled_count


async def _noop(arguments: dict[str, Any], context: CallContext = DETACHED) -> ToolResult:
    return ToolResult()


NORMALIZER = Normalizer()


def tool_for(schema: dict[str, Any]) -> Tool:
    return Tool(
        name="t",
        description="",
        input_schema=schema,
        invoke=_noop,
        origin="mcp:x",
        server="x",
        rename_arguments=True,
    )


@settings(max_examples=300, deadline=None)
@given(cases())
def test_respelled_arguments_normalize_to_the_canonical_ones(
    case: tuple[dict[str, Any], dict[str, Any], dict[str, Any], int],
) -> None:
    schema, canonical, respelled, respelled_count = case
    tool = tool_for(schema)
    out, report = NORMALIZER.arguments(tool, respelled)
    assert out == canonical  # exactly: every key found, every value untouched
    # No key changed without its report entry, and no entry without a change.
    assert len(report) == respelled_count
    assert all(entry.from_ != entry.to for entry in report)
    again, second_report = NORMALIZER.arguments(tool, out)
    assert again == out and second_report == []  # idempotent
