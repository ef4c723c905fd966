"""The settled walk (normalization/settled.py): it may skip the full path only where that
path would have changed nothing but top-level keys, refused nothing, and reported just
those renames."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.normalize_cases import SCHEMA, SEED_MAP, echo_arguments, mcp_tool, registry_with
from toolbus.calls.call import Call
from toolbus.calls.execute import Outcome
from toolbus.config import GuardSettings, Settings, ToolSettings
from toolbus.normalization.guards import Guards
from toolbus.normalization.normalize import Normalizer
from toolbus.normalization.settled import Plans
from toolbus.tools.registry import Tool
from toolbus.wire.errors import InvalidArguments
from toolbus.wire.report import Change
from toolbus.worker.wiring import build_executor

NESTED_SCHEMA = {
    "type": "object",
    "properties": {
        "room": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "floor": {"type": "integer"}},
        },
        "tags": {"type": "array", "items": {"type": "string"}},
        "extra": {"type": "object"},  # anything inside: guarded, never normalized
        "ratio": {"type": "number"},
        "on": {"type": "boolean"},
        "level": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
    },
}
WELL_FORMED = {
    "room": {"name": "kitchen", "floor": 1},
    "tags": ["a", "b"],
    "extra": {"free": ["x", {"y": None}]},
    "ratio": 2,  # an integer is a number: nothing to shape
    "on": True,
    "level": None,
}


def as_text(value: Any) -> str:
    """Exact, key order and all: `True`, `1` and `1.0` stay apart."""
    return json.dumps(value)


def payload_bytes(arguments: dict[str, Any]) -> int:
    return len(json.dumps({"arguments": arguments}).encode())


def plans(
    guards: GuardSettings | None = None, maps: dict[str, dict[str, str]] | None = None
) -> Plans:
    return Plans(Normalizer(SEED_MAP if maps is None else maps), Guards(guards or GuardSettings()))


def settled(tool: Tool, arguments: dict[str, Any], **kwargs: Any) -> bool:
    report: list[Change] = []
    return plans(**kwargs).settled(tool, arguments, payload_bytes(arguments), report) is not None


@pytest.mark.parametrize(
    ("schema", "arguments"),
    [
        (SCHEMA, {"deviceName": "Switch One", "action": "on"}),
        (SCHEMA, {"deviceName": "Switch One", "action": "dim", "level": 40}),
        (NESTED_SCHEMA, WELL_FORMED),
        (NESTED_SCHEMA, {}),
        ({"type": "object"}, {"anything": {"goes": [1, "two"]}}),
    ],
)
def test_a_call_in_the_schemas_shape_is_settled(
    schema: dict[str, Any], arguments: dict[str, Any]
) -> None:
    assert settled(mcp_tool("other", schema), arguments)  # no static map: any key is kept


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ({"device_name": "a", "deviceName": "b", "action": "on"}, "two keys for one property"),
        ({"device_name": "a", "DeviceName": "b", "action": "on"}, "two respellings of one"),
        ({"deviceName": "a", "action": "ON"}, "an enum casing"),
        ({"deviceName": "a", "action": "on", "level": "40"}, "a number as text"),
        ({"deviceName": "a", "action": "on", "level": 4.5}, "a float where integers go"),
        ({"deviceName": 7, "action": "on"}, "a number where text goes"),
        ({"deviceName": "a", "action": "on", "colour": "red"}, "an undeclared key"),
        ({"deviceName": "x" * 2001, "action": "on"}, "a string over the limit"),
        ({"deviceName": "bell\x07", "action": "on"}, "a control character"),
        ({"deviceName": ("a",), "action": "on"}, "no JSON value"),
    ],
)
def test_anything_to_change_or_refuse_is_not_settled(arguments: dict[str, Any], why: str) -> None:
    assert not settled(mcp_tool(), arguments), why


@pytest.mark.parametrize(
    "arguments",
    [
        {"device_name": "a", "command": "on"},  # the static map
        {"DeviceName": "a", "ACTION": "on", "level": 3},  # respelled
        {"brightness": 3, "deviceName": "a", "action": "dim"},
    ],
)
def test_top_level_respellings_are_settled_as_the_full_path_renames_them(
    arguments: dict[str, Any],
) -> None:
    tool = mcp_tool()
    normalizer, guards = Normalizer(SEED_MAP), Guards(GuardSettings())
    report: list[Change] = []
    fast = Plans(normalizer, guards).settled(tool, arguments, payload_bytes(arguments), report)
    full, renamed = normalizer.arguments(tool, arguments)
    assert fast is not None and as_text(fast) == as_text(full)
    assert report == renamed and report  # the same renames, in the same order


def test_a_respelling_below_the_top_is_left_to_the_full_path() -> None:
    assert not settled(mcp_tool(schema=NESTED_SCHEMA), {"room": {"Name": "kitchen"}})
    assert settled(mcp_tool(schema=NESTED_SCHEMA), {"ROOM": {"name": "kitchen"}})


def test_limits_and_sizes_are_left_to_the_full_path() -> None:
    tool = mcp_tool(schema=NESTED_SCHEMA)
    assert not settled(tool, WELL_FORMED, guards=GuardSettings(max_depth=3))  # extra.free[1]
    assert settled(tool, WELL_FORMED, guards=GuardSettings(max_depth=4))
    assert not settled(tool, WELL_FORMED, guards=GuardSettings(max_array_length=1))
    assert not settled(tool, WELL_FORMED, guards=GuardSettings(forbidden_pattern="kitchen"))
    plan, report = plans(), list[Change]()
    assert plan.settled(tool, WELL_FORMED, 0, report) is None  # size unknown: measured there
    assert plan.settled(tool, WELL_FORMED, 64 * 1024 + 1, report) is None


def test_a_default_to_fill_is_not_settled_unless_defaults_are_skipped() -> None:
    schema = {"type": "object", "properties": {"mode": {"type": "string", "default": "auto"}}}
    assert not settled(mcp_tool(schema=schema), {})
    skipping = mcp_tool(schema=schema, settings=ToolSettings(skip_coercions=["default"]))
    assert settled(skipping, {})


@pytest.mark.parametrize(
    "parameter",
    [{"path": True}, {"allowed_roots": ["/srv"]}, {"lenient": True}, {"max_string_length": 3}],
)
def test_parameter_settings_that_change_or_narrow_a_value_are_heeded(
    parameter: dict[str, Any],
) -> None:
    tool = mcp_tool(
        schema=NESTED_SCHEMA,
        settings=ToolSettings.model_validate({"parameters": {"room.name": parameter}}),
    )
    assert not settled(tool, WELL_FORMED)
    elsewhere = ToolSettings.model_validate({"parameters": {"room.floor": {"max_array_length": 1}}})
    assert settled(mcp_tool(schema=NESTED_SCHEMA, settings=elsewhere), WELL_FORMED)


async def test_a_settled_call_reaches_the_tool_as_it_came_with_nothing_reported() -> None:
    executor = build_executor(Settings(argument_maps=SEED_MAP), registry_with(mcp_tool()))
    arguments = {"deviceName": "Switch One", "action": "on"}
    call = Call(
        id="s",
        tool="control_zwave_device",
        arguments=arguments,
        topic="t",
        payload_bytes=payload_bytes(arguments),
    )
    outcome = Outcome()
    _, prepared = executor.prepare(call, outcome)
    assert prepared is arguments  # no copy made on the way
    assert outcome.normalized == []
    missing = {"deviceName": "a"}  # settled, yet short of a required argument
    with pytest.raises(InvalidArguments):  # the schema is checked either way
        executor.prepare(
            Call(
                id="b",
                tool="control_zwave_device",
                arguments=missing,
                topic="t",
                payload_bytes=payload_bytes(missing),
            ),
            Outcome(),
        )


# -- soundness, on random schemas and arguments --------------------------------------

KEYS = ["name", "level", "mode", "items", "deviceName", "device_name", "Mode"]
RESPELLED = {
    "deviceName": "device_name",
    "device_name": "deviceName",
    "mode": "MODE",
    "name": "Name",
}
SCALAR_SCHEMAS: list[dict[str, Any]] = [
    {},
    {"type": "string"},
    {"type": "integer"},
    {"type": "number"},
    {"type": "boolean"},
    {"type": "null"},
    {"type": ["string", "integer"]},
    {"type": "string", "enum": ["on", "off", "dim"]},
    {"type": "integer", "default": 3},
    {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
    {"type": "array"},
    {"type": "object"},
]
schemas = st.recursive(
    st.sampled_from(SCALAR_SCHEMAS),
    lambda inner: st.one_of(
        st.dictionaries(
            st.sampled_from(KEYS), st.sampled_from(SCALAR_SCHEMAS) | inner, min_size=1, max_size=4
        ).map(lambda p: {"type": "object", "properties": p}),
        inner.map(lambda s: {"type": "array", "items": s}),
    ),
    max_leaves=8,
)
properties = st.sampled_from(SCALAR_SCHEMAS) | schemas  # plain ones more often
# Text that some rule would change or refuse, beside any text at all.
ODD_TEXT = ["on", "ON", "dim", "5", "2.5", "true", "[1]", '{"a": 1}', "a\x01b", "xxxxxxxxxxxx"]
texts = st.sampled_from(ODD_TEXT) | st.text(min_size=1, max_size=8)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False, width=16)
    | texts,
    lambda c: (
        st.lists(c, min_size=1, max_size=3)
        | st.dictionaries(st.sampled_from(KEYS), c, min_size=1, max_size=3)
    ),
    max_leaves=10,
)


@st.composite
def conforming(draw: st.DrawFn, schema: Any, *, loose: bool = True) -> Any:
    """Mostly a value of the schema's shape; now and then (if `loose`) any JSON value."""
    if not isinstance(schema, dict) or (loose and draw(st.integers(0, 9)) == 0):
        return draw(json_values)
    if "properties" in schema:
        return {
            # Mostly there, now and then respelled.
            (RESPELLED.get(key, key) if draw(st.integers(0, 5)) == 0 else key): draw(
                conforming(sub)
            )
            for key, sub in schema["properties"].items()
            if draw(st.integers(0, 3))
        }
    if "items" in schema:
        return draw(st.lists(conforming(schema["items"]), max_size=3))
    if "enum" in schema:  # now and then in another letter case
        return draw(st.sampled_from([*schema["enum"], *(e.upper() for e in schema["enum"])]))
    kinds = {
        "string": texts,
        "integer": st.integers(-3, 3),
        "number": st.floats(allow_nan=False, allow_infinity=False, width=16),
        "boolean": st.booleans(),
        "null": st.none(),
        "array": st.lists(json_values, max_size=3),
        "object": st.dictionaries(st.sampled_from(KEYS), json_values, max_size=3),
    }
    declared = schema.get("type")
    if isinstance(declared, str):
        return draw(kinds[declared])
    if isinstance(declared, list):
        return draw(kinds[draw(st.sampled_from(declared))])
    return draw(json_values)


@st.composite
def cases(draw: st.DrawFn) -> tuple[Tool, Guards, Normalizer, dict[str, Any]]:
    schema = draw(st.dictionaries(st.sampled_from(KEYS), properties, min_size=1, max_size=4))
    full = {"type": "object", "properties": schema}
    guards = GuardSettings(
        max_string_length=draw(st.integers(1, 12)),
        max_array_length=draw(st.integers(0, 4)),
        max_depth=draw(st.integers(1, 5)),
        forbidden_pattern=draw(st.sampled_from([None, "x{3}", "(?i)dim"])),
    )
    tool = Tool(
        name="t",
        description="",
        input_schema=full,
        invoke=echo_arguments,
        origin="mcp:x",
        server="x",
        rename_arguments=draw(st.booleans()),
        settings=ToolSettings(skip_coercions=draw(st.sampled_from([[], ["default"]]))),
    )
    maps = draw(st.sampled_from([{}, {"t": {"device_name": "deviceName", "mode.Mode": "mode"}}]))
    arguments: dict[str, Any] = draw(conforming(full, loose=False))
    if draw(st.integers(0, 3)) == 0:
        arguments.update(draw(st.dictionaries(st.sampled_from(KEYS), json_values, max_size=2)))
    return tool, Guards(guards), Normalizer(maps), arguments


@settings(max_examples=500, deadline=None)
@given(cases())
def test_a_settled_call_is_what_the_full_path_would_make_of_it(
    case: tuple[Tool, Guards, Normalizer, dict[str, Any]],
) -> None:
    tool, guards, normalizer, arguments = case
    size = payload_bytes(arguments)
    report: list[Change] = []
    fast = Plans(normalizer, guards).settled(tool, arguments, size, report)
    if fast is None:
        return
    guards.check_envelope(tool, arguments, size)  # raises on any violation
    normalized, renamed = normalizer.arguments(tool, arguments)
    checked, dropped = guards.check_values(tool, normalized)
    assert dropped == []
    assert renamed == report  # top-level renames only, in order
    assert as_text(checked) == as_text(fast)
    if not report:
        assert fast is arguments  # nothing renamed: not even copied


def test_a_respelled_key_meets_the_settings_and_maps_of_its_property() -> None:
    narrow = ToolSettings.model_validate({"parameters": {"deviceName": {"max_string_length": 3}}})
    assert not settled(mcp_tool(settings=narrow), {"device_name": "abcdef", "action": "on"})
    assert settled(mcp_tool(settings=narrow), {"device_name": "abc", "action": "on"})
    # A map below the property: its keys would be renamed, so the full path decides.
    schema = {"type": "object", "properties": {"extra": {"type": "object"}}}
    maps = {"other": {"extra.old": "new"}}
    assert not settled(mcp_tool("other", schema), {"EXTRA": {"old": 1}}, maps=maps)
    assert settled(mcp_tool("other", schema), {"EXTRA": {"old": 1}}, maps={})
