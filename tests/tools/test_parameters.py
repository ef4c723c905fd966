"""A tool's parameters as `invalid_arguments` lists them (parameters.py): built once, bounded."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.normalize_cases import mcp_tool
from toolbus.tools.parameters import (
    MAX_DESCRIPTION_CHARS,
    MAX_ENUM_VALUES,
    MAX_PARAMETERS,
    summarize,
    type_text,
)
from toolbus.tools.shapes import build_shape


def test_the_seed_schema() -> None:
    assert list(mcp_tool().parameters.listed) == [
        {"name": "deviceName", "type": "string", "required": True},
        {"name": "action", "type": "string", "required": True, "enum": ["on", "off", "dim"]},
        {"name": "level", "type": "integer|null", "required": False},
        {"name": "newParameterName", "type": "string", "required": False},
    ]
    assert mcp_tool().parameters.omitted == 0


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "string"}, "string"),
        ({"type": ["null", "string"]}, "string|null"),
        ({"anyOf": [{"type": "string"}, {"type": "null"}]}, "string|null"),
        ({"$ref": "#/$defs/Count"}, "integer"),
        ({"allOf": [{"$ref": "#/$defs/Count"}]}, "integer"),
        ({"type": "array", "items": {"type": "string"}}, "array"),
        ({"items": {"type": "string"}}, "array"),
        ({"properties": {"a": {}}}, "object"),
        ({"enum": ["a", "b"]}, "string"),
        ({"enum": ["a", None]}, "string|null"),
        ({"const": 3}, "integer"),
        ({}, "any"),
        ({"description": "anything"}, "any"),
    ],
)
def test_types_as_the_schema_says_them(schema: dict[str, Any], expected: str) -> None:
    root = {
        "type": "object",
        "properties": {"p": schema},
        "$defs": {"Count": {"type": "integer"}},
    }
    [parameter] = summarize(root, build_shape(root)).listed
    assert parameter["type"] == expected
    assert type_text(build_shape(root).properties["p"]) == expected


def test_descriptions_are_trimmed_and_cut() -> None:
    root = {
        "type": "object",
        "properties": {
            "short": {"type": "string", "description": "  The room.\n"},
            "long": {"type": "string", "description": "x" * 1000},
            "blank": {"type": "string", "description": "   "},
        },
    }
    short, long, blank = summarize(root, build_shape(root)).listed
    assert short["description"] == "The room."
    assert len(long["description"]) == MAX_DESCRIPTION_CHARS
    assert long["description"].startswith("xxx") and long["description"].endswith("…")
    assert "description" not in blank


def test_long_enums_are_cut_and_say_how_much() -> None:
    values = [f"v{i}" for i in range(MAX_ENUM_VALUES + 7)]
    root = {"type": "object", "properties": {"mode": {"type": "string", "enum": values}}}
    [mode] = summarize(root, build_shape(root)).listed
    assert mode["enum"] == values[:MAX_ENUM_VALUES] and mode["enum_omitted"] == 7


def test_at_most_max_parameters_required_ones_first_in_schema_order() -> None:
    count = MAX_PARAMETERS + 10
    names = [f"p{i:02}" for i in range(count)]
    required = names[-3:]  # past the bound in schema order: kept all the same
    root = {
        "type": "object",
        "properties": {name: {"type": "string"} for name in names},
        "required": required,
    }
    parameters = summarize(root, build_shape(root))
    listed = [p["name"] for p in parameters.listed]
    assert len(listed) == MAX_PARAMETERS and parameters.omitted == 10
    assert listed == names[: MAX_PARAMETERS - 3] + required
    details = parameters.details()
    assert details["parameters_omitted"] == 10
    assert len(details["signature"]) == MAX_PARAMETERS


def test_nothing_omitted_says_nothing() -> None:
    details = mcp_tool().parameters.details()
    assert "parameters_omitted" not in details
    assert [p["name"] for p in details["signature"]] == [
        "deviceName",
        "action",
        "level",
        "newParameterName",
    ]


def test_details_are_copies_a_reply_cannot_change_the_tool() -> None:
    tool = mcp_tool()
    first = tool.parameters.details()
    first["parameters"][1]["enum"].append("explode")
    first["signature"].clear()
    again = tool.parameters.details()
    assert again["parameters"][1]["enum"] == ["on", "off", "dim"] and again["signature"]


def test_properties_merged_from_all_of_are_listed() -> None:
    root = {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"type": "object", "properties": {"b": {"type": "boolean"}}},
        ]
    }
    assert list(summarize(root, build_shape(root)).listed) == [
        {"name": "a", "type": "string", "required": True},
        {"name": "b", "type": "boolean", "required": False},
    ]


def test_a_schema_without_properties_lists_none() -> None:
    for root in ({"type": "object"}, {}, {"type": "object", "properties": "nonsense"}):
        parameters = summarize(root, build_shape(root))
        assert parameters.listed == () and parameters.details()["parameters"] == []
