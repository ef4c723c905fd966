"""The normalizer (normalization/normalize.py): argument keys respelled, values shaped."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.support.normalize_cases import SCHEMA, echo_arguments, mcp_tool, normalize
from toolbus.config import ToolSettings
from toolbus.normalization.normalize import Normalizer, camel_to_snake, snake_to_camel
from toolbus.tools.registry import Tool
from toolbus.wire.errors import InvalidArguments

# -- the seed scenarios, verbatim -------------------------------------------------


def test_seed_static_map() -> None:
    out, report = normalize(mcp_tool(), {"device_name": "Switch One", "command": "on"})
    assert out == {"deviceName": "Switch One", "action": "on"}
    assert report == [
        ("arguments.device_name", "device_name", "deviceName", "static_map"),
        ("arguments.command", "command", "action", "static_map"),
    ]


def test_seed_snake_to_camel_and_level_unchanged() -> None:
    out, report = normalize(mcp_tool("other"), {"new_parameter_name": "x", "level": 5})
    assert out == {"newParameterName": "x", "level": 5}
    assert report == [
        ("arguments.new_parameter_name", "new_parameter_name", "newParameterName", "snake_to_camel")
    ]


def test_seed_local_tools_unchanged() -> None:
    local = Tool(name="echo", description="", input_schema=SCHEMA, invoke=echo_arguments)
    out, report = normalize(local, {"device_name": "a", "Level": "5"})
    assert out == {"device_name": "a", "Level": "5"} and report == []


@pytest.mark.parametrize(
    ("snake", "camel", "snake_again"),
    [
        ("device_name", "deviceName", "device_name"),
        # A run of capitals reads back as one word: the trip is lossy, which is why keys
        # are matched by spelling key and these helpers only name the rule in the report.
        ("a_b_c", "aBC", "a_bc"),
        ("plain", "plain", "plain"),
    ],
)
def test_case_helpers(snake: str, camel: str, snake_again: str) -> None:
    assert snake_to_camel(snake) == camel
    assert camel_to_snake(camel) == snake_again


# -- spellings, both directions ----------------------------------------------------

SNAKE_SCHEMA = {
    "type": "object",
    "properties": {
        "ticket_title": {"type": "string"},
        "assignee_name": {"type": "string"},
        "due_in_days": {"type": "integer"},
    },
}


def test_camel_pascal_kebab_to_snake() -> None:
    tool = mcp_tool("create_ticket", SNAKE_SCHEMA)
    out, report = normalize(tool, {"ticketTitle": "t", "AssigneeName": "a", "due-in-days": 3})
    assert out == {"ticket_title": "t", "assignee_name": "a", "due_in_days": 3}
    assert [r[3] for r in report] == ["camel_to_snake", "camel_to_snake", "spelling"]


def test_heuristic_only_for_undeclared_keys_of_open_camel_objects() -> None:
    out, _ = normalize(mcp_tool("other"), {"max_results": 3})
    assert out == {"maxResults": 3}  # open camelCase schema: extra keys follow its style
    closed = {**SCHEMA, "additionalProperties": False}
    assert normalize(mcp_tool("other", closed), {"max_results": 3})[0] == {"max_results": 3}
    assert normalize(mcp_tool("other", SNAKE_SCHEMA), {"max_results": 3})[0] == {"max_results": 3}


def test_two_keys_for_one_property_are_refused() -> None:
    with pytest.raises(InvalidArguments) as caught:
        normalize(mcp_tool(), {"device_name": "a", "DeviceName": "b"})
    assert caught.value.details["property"] == "deviceName"


def test_values_are_never_renamed() -> None:
    out, _ = normalize(
        mcp_tool("other"), {"device_name": "device_name", "newParameterName": "new_parameter_name"}
    )
    assert out == {"deviceName": "device_name", "newParameterName": "new_parameter_name"}


# -- value shapes ------------------------------------------------------------------

SHAPES = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string"}},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "enabled": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["Eco", "Comfort"]},
        "filter": {"type": "object", "properties": {"room": {"type": "string"}}},
        "limit": {"type": "integer", "default": 10},
    },
}


def test_value_coercions() -> None:
    out, report = normalize(
        mcp_tool("shapes", SHAPES),
        {
            "tags": "one",
            "count": "5",
            "ratio": "2.5",
            "enabled": "TRUE",
            "mode": "eco",
            "filter": '{"room": "hall"}',
        },
    )
    assert out == {
        "tags": ["one"],
        "count": 5,
        "ratio": 2.5,
        "enabled": True,
        "mode": "Eco",
        "filter": {"room": "hall"},
        "limit": 10,
    }
    assert {r[3] for r in report} == {
        "wrap_array",
        "string_to_integer",
        "string_to_number",
        "string_to_boolean",
        "enum_case",
        "parse_json",
        "default",
    }


@pytest.mark.parametrize("value", ["5.5", "5e3", "five", "", " 5", "NaN", "Infinity"])
def test_nothing_lossy_for_integers(value: str) -> None:
    out, report = normalize(mcp_tool("shapes", SHAPES), {"count": value})
    assert out["count"] == value and [r for r in report if r[3] != "default"] == []


@pytest.mark.parametrize("value", ["9" * 5000, "-" + "9" * 4301])
def test_an_integer_past_pythons_limit_stays_text(value: str) -> None:
    """More digits than Python makes an int of (4 300): no crash, the text stays for the
    schema's validation to refuse (issue 24)."""
    out, report = normalize(mcp_tool("shapes", SHAPES), {"count": value, "ratio": value})
    assert (out["count"], out["ratio"]) == (value, value)
    assert [r for r in report if r[3] != "default"] == []


def test_json_text_holding_an_infinite_number_is_not_parsed() -> None:
    """`1e999` is JSON Python reads as infinity: a `filter` given as that text is left
    as text (refused by validation), never handed to a tool as infinity."""
    out, _ = normalize(mcp_tool("shapes", SHAPES), {"filter": '{"room": 1e999}'})
    assert out["filter"] == '{"room": 1e999}'


def test_each_coercion_can_be_switched_off() -> None:
    none = mcp_tool("shapes", SHAPES, ToolSettings(skip_coercions=["all"]))
    out, report = Normalizer().arguments(none, {"tags": "one", "count": "5"})
    assert out == {"tags": "one", "count": "5"} and report == []
    some = mcp_tool("shapes", SHAPES, ToolSettings(skip_coercions=["wrap_array", "default"]))
    out, _ = Normalizer().arguments(some, {"tags": "one", "count": "5"})
    assert out == {"tags": "one", "count": 5}


def test_idempotent() -> None:
    tool = mcp_tool("shapes", SHAPES)
    once, _ = normalize(tool, {"Tags": "one", "count": "5", "mode": "COMFORT"})
    twice, report = normalize(tool, once)
    assert twice == once and report == []


# -- numbers where a string is wanted -------------------------------------------------

STRINGS = {
    "type": "object",
    "properties": {
        "text": {"type": "string"},
        "maybe": {"type": ["string", "null"]},
        "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "loose": {"type": ["string", "number"]},
        "codes": {"type": "array", "items": {"type": "string"}},
        "place": {
            "type": "object",
            "properties": {"zip": {"$ref": "#/$defs/Zip"}},
        },
    },
    "$defs": {"Zip": {"type": "string"}},
}


@pytest.mark.parametrize(
    ("value", "text"),
    [(1234, "1234"), (-7, "-7"), (0, "0"), (10**30, str(10**30)), (12.5, "12.5"), (3.0, "3.0")],
)
def test_a_number_for_a_string_becomes_its_text(value: float, text: str) -> None:
    out, report = normalize(mcp_tool("strings", STRINGS), {"text": value, "maybe": value})
    assert out == {"text": text, "maybe": text}
    kind = "integer" if isinstance(value, int) else "number"
    assert report == [
        ("arguments.text", kind, "string", "number_to_string"),
        ("arguments.maybe", kind, "string", "number_to_string"),
    ]


@pytest.mark.parametrize(
    "value",
    [
        True,  # a boolean is no number
        False,
        0.1,  # not exactly 0.1 as a double: the text would be a guess
        2.0**-30,
        1e300 * 10,  # infinity, as an overflowing `1e400` parses
        float("nan"),
    ],
)
def test_lossy_or_non_numbers_are_left_for_validation(value: float) -> None:
    out, report = normalize(mcp_tool("strings", STRINGS), {"text": value})
    assert out["text"] is value and report == []


def test_a_union_that_accepts_the_number_keeps_it() -> None:
    out, report = normalize(mcp_tool("strings", STRINGS), {"either": 5, "loose": 2.5})
    assert out == {"either": 5, "loose": 2.5} and report == []
    # An integer-or-string given a fraction asked for an integer: validation judges it.
    out, report = normalize(mcp_tool("strings", STRINGS), {"either": 2.5})
    assert out == {"either": 2.5} and report == []


def test_numbers_for_strings_nested_in_arrays_and_objects() -> None:
    out, report = normalize(
        mcp_tool("strings", STRINGS), {"codes": [1, "b", 2.5], "place": {"zip": 10115}}
    )
    assert out == {"codes": ["1", "b", "2.5"], "place": {"zip": "10115"}}
    assert [(path, rule) for path, _, _, rule in report] == [
        ("arguments.codes[0]", "number_to_string"),
        ("arguments.codes[2]", "number_to_string"),
        ("arguments.place.zip", "number_to_string"),
    ]


def test_a_lone_number_for_an_array_of_strings_is_wrapped_then_converted() -> None:
    out, report = normalize(mcp_tool("strings", STRINGS), {"codes": 7})
    assert out == {"codes": ["7"]}
    assert [r[3] for r in report] == ["wrap_array", "number_to_string"]


def test_number_to_string_can_be_switched_off() -> None:
    tool = mcp_tool("strings", STRINGS, ToolSettings(skip_coercions=["number_to_string"]))
    out, report = Normalizer().arguments(tool, {"text": 1234})
    assert out == {"text": 1234} and report == []


def test_number_to_string_applies_to_tools_that_are_never_renamed() -> None:
    tool = replace(mcp_tool("strings", STRINGS), rename_arguments=False)
    out, report = Normalizer().arguments(tool, {"text": 1234})
    assert out == {"text": "1234"} and [c.rule for c in report] == ["number_to_string"]
